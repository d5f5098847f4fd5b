#include "backend/pinned.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "backend/executor.h"

namespace tpu::backend {
namespace {

// Page-aligned host blocks, registered with the plugin for direct transfers where
// it offers that (PJRT_Client_DmaMap; TPU runtimes do). Pinning starts the runtime,
// as CUDA's does.
struct Block {
  size_t size;
  bool mapped;
};
std::mutex g_mu;
std::map<uintptr_t, Block> g_blocks;  // by start address

constexpr size_t kPage = 4096;

void free_pinned(void* p) {
  if (!p) return;
  bool mapped = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_blocks.find(reinterpret_cast<uintptr_t>(p));
    if (it != g_blocks.end()) {
      mapped = it->second.mapped;
      g_blocks.erase(it);
    }
  }
  if (mapped && !runtime::Client::forked_after_init()) runtime::Client::get().dma_unmap(p);
  std::free(p);
}

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
    size_t size = (nbytes + kPage - 1) / kPage * kPage;
    void* p = nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&p, kPage, size) == 0,
                     "out of host memory pinning ", nbytes, " bytes");
    bool mapped = guarded([&] { return runtime::Client::get().dma_map(p, size); });
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_blocks[reinterpret_cast<uintptr_t>(p)] = Block{size, mapped};
    }
    return c10::DataPtr(p, p, &free_pinned, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

PinnedAllocator g_pinned;

}  // namespace

c10::Allocator* pinned_allocator() { return &g_pinned; }

bool is_pinned_ptr(const void* ptr) {
  auto a = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_blocks.upper_bound(a);  // first block starting after `a`
  if (it == g_blocks.begin()) return false;
  --it;
  return a < it->first + it->second.size;
}

}  // namespace tpu::backend
