// The promise behind each `tpu` storage: a device buffer, a pending value of the
// deferred graph, or nothing yet (memory from `empty` that no op has written). The
// at::Storage's DataPtr carries it.
#pragma once
#include <string>
#include <ATen/Tensor.h>

#include "backend/deferred.h"
#include "ir/views.h"
#include "runtime/client.h"

namespace tpu::backend {

struct StorageData {
  int device = 0;
  size_t nbytes = 0;
  Operand value;  // empty: not written yet (reads see zeros)
  std::string donated_to;  // consumed by this op (jax_op donate_argnums): reads raise
};

// The allocator registered for PrivateUse1: it hands out promises, never host memory.
c10::Allocator* tpu_allocator();

StorageData& storage_of(const at::Tensor& t);
// Raises when the storage was donated (consumed by an op): it holds nothing to read.
void check_not_donated(const StorageData& s);
// The tensor's view of its storage, in elements of its dtype.
ir::Geometry geometry_of(const at::Tensor& t);
// The value's type, or (when not written yet) a flat type of the tensor's dtype.
ir::Type storage_type(const at::Tensor& t);
// The storage's value, zeros if nothing was written yet (pending while deferring).
Operand storage_value(const at::Tensor& t);
// The storage's buffer: runs the pending graph if the value is still pending.
runtime::BufferPtr materialized(const at::Tensor& t);
// dtype, view and storage layout: what a program reading the tensor depends on.
std::string view_key(const at::Tensor& t);
// A dense value holding exactly the tensor's values (its storage's value when that fits).
Operand dense_value(const at::Tensor& t);
runtime::BufferPtr dense_buffer(const at::Tensor& t);  // the same, materialized
// A new contiguous tensor on `device` whose storage holds `value`.
at::Tensor wrap_value(Operand value, c10::ScalarType dtype, at::IntArrayRef sizes, int device);
// The same with `strides` (non-overlapping and dense): `value` holds the storage's
// contents, the logical values transposed into the order of decreasing strides.
at::Tensor wrap_value(Operand value, c10::ScalarType dtype, at::IntArrayRef sizes, at::IntArrayRef strides,
                      int device);
// That order (outermost first) for a non-overlapping and dense layout, or empty when it
// is the identity (a contiguous layout).
std::vector<int64_t> physical_order(at::IntArrayRef sizes, at::IntArrayRef strides);
int device_index(const at::Tensor& t);
// ir::reinterpret that also crosses between complex and real dtypes (StableHLO's
// bitcast_convert refuses complex): a complex element is its (re, im) pair of parts.
// Bytes that do not fill a last element of `to` are padded with zeros (a float storage
// of odd length seen as complex): no valid view addresses that element.
ir::Value reinterpret_bytes(ir::Builder& b, const ir::Value& storage, DType to);
// `v`'s bytes as a storage of type `st` again (dropping such padding).
ir::Value as_storage(ir::Builder& b, const ir::Value& v, const ir::Type& st);
// The complex conjugate of a complex value.
ir::Value conj_value(ir::Builder& b, const ir::Value& v);
// A tensor's lazy conjugate / negative bits applied to its stored values `v` (both are
// self-inverse: the same turns a logical value back into the one to store).
ir::Value apply_math_bits(ir::Builder& b, const ir::Value& v, const at::Tensor& t);
// Key suffix for those bits (programs differ by them).
const char* math_bits_key(const at::Tensor& t);

}  // namespace tpu::backend
