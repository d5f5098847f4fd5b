// Pinned host memory for `tpu`: what tensor.pin_memory(), torch.empty(pin_memory=True)
// and DataLoader(pin_memory=True) allocate, and how is_pinned() recognises it.
#pragma once
#include <c10/core/Allocator.h>

namespace tpu::backend {

c10::Allocator* pinned_allocator();
bool is_pinned_ptr(const void* p);  // any address inside a live pinned block

}  // namespace tpu::backend
