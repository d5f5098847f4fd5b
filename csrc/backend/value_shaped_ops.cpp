// Ops whose output shape depends on tensor values (nonzero, masked_select, indexing
// with boolean masks). One program per input signature packs the selected entries
// first and counts them; the host reads the count (a sync, as on CUDA) and returns a
// view of that prefix, so every count shares the same compiled program.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/library.h>

#include "backend/dtypes.h"
#include "backend/executor.h"
#include "backend/storage.h"
#include "lowering/helpers.h"

namespace tpu::backend {
namespace {

using ir::Builder;
using ir::Type;
using ir::Value;

// Positions of `mask` ([n], bool), selected ones first in ascending order (a stable
// sort), carrying `payload` along; and the number selected.
std::pair<Value, Value> selected_first(Builder& b, const Value& mask, const Value& payload) {
  int64_t n = mask.shape()[0];
  Value key = b.select(mask, b.constant(0, DType::I32, {n}), b.constant(1, DType::I32, {n}));
  auto sorted = b.sort({key, payload}, 0, true, [](Builder& r, const std::vector<Value>& a) {
    return std::vector<Value>{r.compare(a[0], a[1], ir::Cmp::LT)};
  });
  Value count = lowering::reduce_sum(b, b.convert(mask, DType::I64), {0});
  return {sorted[1], count};
}

int64_t read_count(const runtime::BufferPtr& count) {
  int64_t c = 0;
  runtime::Client::get().to_host(*count, &c, sizeof(c));
  return c;
}

Type type_of(const at::Tensor& t, const char* op) {
  return Type{device_dtype(t.scalar_type(), op), std::vector<int64_t>(t.sizes().begin(), t.sizes().end())};
}

at::Tensor nonzero_tpu(const at::Tensor& self) {
  return guarded([&] {
    int64_t n = self.numel(), r = self.dim();
    int dev = device_index(self);
    if (n == 0) return at::empty({0, r}, self.options().dtype(at::kLong));
    Type it = type_of(self, "nonzero");
    auto res = run_internal("nonzero:" + it.str(), [&](Builder& b) {
      Value x = b.reshape(b.param(it), {n});
      auto [order, count] = selected_first(b, b.convert(x, DType::Bool), b.iota(Type{DType::I64, {n}}, 0));
      std::vector<Value> cols;
      ir::Shape strides = ir::contiguous_strides(it.shape);
      for (int64_t d = 0; d < r; ++d) {  // flat position -> coordinate d
        Value q = b.binary("stablehlo.divide", order, b.constant(double(strides[d]), DType::I64, {n}));
        Value c = b.binary("stablehlo.remainder", q, b.constant(double(it.shape[d]), DType::I64, {n}));
        cols.push_back(b.reshape(c, {n, 1}));
      }
      Value coords = r ? b.concatenate(cols, 1) : b.constant(0, DType::I64, {n, 0});
      return std::vector<Value>{coords, count};
    }, {dense_value(self)}, dev);
    at::Tensor all = wrap_value(res[0], at::kLong, {n, r}, dev);
    return all.narrow(0, 0, read_count(resolve(res[1])));
  });
}

at::Tensor masked_select_tpu(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask, got ",
              mask.scalar_type());
  return guarded([&] {
    std::vector<int64_t> shape = at::infer_size(self.sizes(), mask.sizes());
    int64_t n = c10::multiply_integers(shape);
    int dev = device_index(self);
    if (n == 0) return at::empty({0}, self.options());
    Type st = type_of(self, "masked_select"), mt = type_of(mask, "masked_select");
    auto res = run_internal("masked_select:" + st.str() + mt.str(), [&](Builder& b) {
      Value x = b.reshape(lowering::broadcast_to(b, b.param(st), shape), {n});
      Value m = b.reshape(lowering::broadcast_to(b, b.param(mt), shape), {n});
      auto [values, count] = selected_first(b, m, x);
      return std::vector<Value>{values, count};
    }, {dense_value(self), dense_value(mask)}, dev);
    at::Tensor all = wrap_value(res[0], self.scalar_type(), {n}, dev);
    return all.narrow(0, 0, read_count(resolve(res[1])));
  });
}

}  // namespace

// Boolean masks among an op's Tensor?[] indices become the long coordinates of their
// true entries (PyTorch's own rule), then the op runs again on this backend.
bool redispatch_with_mask_coordinates(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t nargs = schema.arguments().size();
  bool changed = false;
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& v = (*stack)[stack->size() - nargs + i];
    if (!v.isList() || v.toList().elementType()->kind() != c10::TypeKind::OptionalType) continue;
    c10::List<std::optional<at::Tensor>> out;
    auto l = v.toOptionalTensorList();
    for (size_t j = 0; j < l.size(); ++j) {
      std::optional<at::Tensor> t = l.get(j);
      if (t.has_value() && t->defined() && (t->scalar_type() == at::kBool || t->scalar_type() == at::kByte)) {
        at::Tensor coords = nonzero_tpu(t->to(at::kBool));
        for (int64_t d = 0; d < t->dim(); ++d) out.push_back(coords.select(1, d));
        changed = true;
      } else {
        out.push_back(t);
      }
    }
    v = out;
  }
  if (changed) op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), stack);
  return changed;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("nonzero", nonzero_tpu);
  m.impl("masked_select", masked_select_tpu);
}

}  // namespace tpu::backend
