// Reading and writing strided views of a storage inside a program.
// A storage is one device buffer (any shape, dense row-major); a view is
// (sizes, strides, offset) in elements over that buffer's flattened contents.
#pragma once
#include "ir/builder.h"

namespace tpu::ir {

struct Geometry {
  Shape sizes;
  Shape strides;
  int64_t offset = 0;
  int64_t numel() const;
  bool is_contiguous() const;
  // True when the view is exactly the storage's contents in order.
  bool covers(const Shape& storage_shape) const;
  std::string key() const;
};

// The storage's bytes as a flat array of `to` (a dtype view of the storage, like
// PyTorch's Tensor.view(dtype) or a byte view for serialization).
Value reinterpret(Builder& b, const Value& storage, DType to);

// The view's values, shaped `g.sizes`, read from `storage`.
Value read_view(Builder& b, const Value& storage, const Geometry& g);
// The same with the view's offset a runtime operand (an i64 scalar; g.offset unused):
// one program reads the view wherever it starts. The view must hold an element.
Value read_view_at(Builder& b, const Value& storage, const Geometry& g, const Value& offset);
// The storage after writing `value` (shaped `g.sizes`, any dtype: converted) into the view.
// `storage` may be null when the view covers the whole storage.
Value write_view(Builder& b, const Value* storage, const Type& storage_type, const Geometry& g,
                 const Value& value);
// The same with the view's offset a runtime operand (an i64 scalar; g.offset unused), as
// read_view_at reads it: one program writes the view wherever it starts.
Value write_view_at(Builder& b, const Value& storage, const Geometry& g, const Value& value,
                    const Value& offset);

}  // namespace tpu::ir
