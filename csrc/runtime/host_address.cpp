#include "runtime/host_address.h"
#include "runtime/pjrt_args.h"

#include <cstring>
#include <mutex>
#include <unordered_map>

namespace tpu::runtime {

namespace {

bool has_unsafe_pointer(const PJRT_Api* api) {
  return api->struct_size > offsetof(PJRT_Api, PJRT_Buffer_UnsafePointer) &&
         api->PJRT_Buffer_UnsafePointer != nullptr;
}

// The plugin's address for a buffer; 0 when it reports none (error: ignored and freed).
uintptr_t unsafe_pointer(Client& c, PJRT_Buffer* b) {
  auto a = ARGS(PJRT_Buffer_UnsafePointer_Args);
  a.buffer = b;
  if (PJRT_Error* err = c.api()->PJRT_Buffer_UnsafePointer(&a)) {
    auto d = ARGS(PJRT_Error_Destroy_Args);
    d.error = err;
    c.api()->PJRT_Error_Destroy(&d);
    return 0;
  }
  return a.buffer_pointer;
}

bool probe(Client& c, int device) {
  if (!has_unsafe_pointer(c.api())) return false;
  // Aligned as plugins want host arrays they may alias.
  alignas(64) static float array[16];
  uintptr_t got = 0;
  {
    // The array is static: nothing to release, whenever the plugin lets go of it.
    BufferPtr b = c.from_host_borrowed(array, DType::F32, {16}, device, [] {});
    got = unsafe_pointer(c, b->raw());
  }
  return got == reinterpret_cast<uintptr_t>(array);
}

void await_ready(Client& c, const Buffer& b) {
  auto r = ARGS(PJRT_Buffer_ReadyEvent_Args);
  r.buffer = b.raw();
  c.check(c.api()->PJRT_Buffer_ReadyEvent(&r), "waiting for a buffer");
  auto w = ARGS(PJRT_Event_Await_Args);
  w.event = r.event;
  PJRT_Error* err = c.api()->PJRT_Event_Await(&w);
  auto d = ARGS(PJRT_Event_Destroy_Args);
  d.event = r.event;
  c.api()->PJRT_Event_Destroy(&d);
  c.check(err, "waiting for a buffer");
}

}  // namespace

bool buffers_in_host_memory(Client& client, int device) {
  static std::mutex mu;
  static std::unordered_map<int, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(device);
  if (it != known.end()) return it->second;
  bool yes = probe(client, device);
  known[device] = yes;
  return yes;
}

const void* host_address(Client& client, const Buffer& b) {
  if (!buffers_in_host_memory(client, b.device())) return nullptr;
  await_ready(client, b);
  return reinterpret_cast<const void*>(unsafe_pointer(client, b.raw()));
}

void* writable_host_address(Client& client, const Buffer& b) {
  return const_cast<void*>(host_address(client, b));
}

}  // namespace tpu::runtime
