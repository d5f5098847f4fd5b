#include "distributed/host_pool.h"

#include <ATen/ATen.h>

namespace tpu::distributed {

namespace {
bool is_free(const at::Tensor& block) { return block.storage().use_count() == 1; }
}  // namespace

at::Tensor HostPool::take(at::IntArrayRef sizes, at::ScalarType dtype) {
  int64_t numel = c10::multiply_integers(sizes);
  int64_t nbytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  at::TensorOptions opts = at::TensorOptions().dtype(dtype).device(at::kCPU);
  if (nbytes < kMinBytes) return at::empty(sizes, opts);
  at::Tensor block;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& b : blocks_) {
      if (b.numel() == nbytes && is_free(b)) {
        block = b;
        break;
      }
    }
    if (!block.defined()) {
      // Make room: drop free blocks of other sizes, oldest first.
      for (size_t i = 0; i < blocks_.size() && bytes_ + nbytes > kMaxBytes;) {
        if (is_free(blocks_[i])) {
          bytes_ -= blocks_[i].numel();
          blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
      if (bytes_ + nbytes > kMaxBytes) return at::empty(sizes, opts);
      block = at::empty({nbytes}, opts.dtype(at::kByte));
      blocks_.push_back(block);
      bytes_ += nbytes;
    }
  }
  // A typed view of the block's storage (each view holds it: the block is then in use).
  return at::empty({0}, opts).set_(block.storage(), 0, sizes);
}

}  // namespace tpu::distributed
