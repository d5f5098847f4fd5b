// The promise behind each `tpu` storage: a device buffer, or nothing yet
// (memory from `empty` that no op has written). The at::Storage's DataPtr carries it.
#pragma once
#include <ATen/Tensor.h>

#include "ir/views.h"
#include "runtime/client.h"

namespace tpu::backend {

struct StorageData {
  int device = 0;
  size_t nbytes = 0;
  runtime::BufferPtr buffer;  // null: not written yet (reads see zeros)
};

// The allocator registered for PrivateUse1: it hands out promises, never host memory.
c10::Allocator* tpu_allocator();

StorageData& storage_of(const at::Tensor& t);
// The tensor's view of its storage, in elements of its dtype.
ir::Geometry geometry_of(const at::Tensor& t);
// The buffer's type, or (when not written yet) a flat type of the tensor's dtype.
ir::Type storage_type(const at::Tensor& t);
// The storage's buffer, materializing zeros if nothing was written yet.
runtime::BufferPtr materialized(const at::Tensor& t);
// dtype, view and storage layout: what a program reading the tensor depends on.
std::string view_key(const at::Tensor& t);
// A dense buffer holding exactly the tensor's values (its storage's buffer when that fits).
runtime::BufferPtr dense_buffer(const at::Tensor& t);
// A new contiguous tensor on `device` whose storage holds `buffer`.
at::Tensor wrap_buffer(runtime::BufferPtr buffer, c10::ScalarType dtype, at::IntArrayRef sizes,
                       int device);
int device_index(const at::Tensor& t);

}  // namespace tpu::backend
