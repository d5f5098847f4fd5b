// Sparse COO tensors on tpu (dispatch key SparsePrivateUse1). A COO tensor is an
// indices tensor ([sparse_dim, nnz], int64) and a values tensor ([nnz, *dense_sizes])
// held by a SparseTensorImpl; both are ordinary tpu tensors. Two kinds of kernel:
//  - PyTorch's own device-generic COO kernels (metadata, construction, resize, copy,
//    clone, unary ufuncs on the values), registered here as PyTorch registers them
//    for SparseCUDA: their math reaches our dense lowerings through the dispatcher;
//  - ours, written from dense ops, where PyTorch's kernel is CPU- or CUDA-specific
//    (coalesce, to_dense, add/sub/mul/div with a sparse operand, sparse_mask, sparse @
//    dense, dense -> sparse).
// Nothing here computes on the host; a count that sizes a result (unique, nonzero) is
// read back as CUDA reads it. Other sparse ops raise an error naming the op and
// suggesting a dense route; compressed layouts (CSR/CSC/BSR/BSC) are refused by name.
#include <ATen/ATen.h>
#include <ATen/NativeFunctions.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/native/SparseTensorUtils.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cctype>
#include <optional>
#include <sstream>

namespace tpu::backend {
namespace {

// Entries' flat position over the sparse dims (row-major), [nnz] int64.
at::Tensor flat_positions(const at::Tensor& indices, at::IntArrayRef sizes, int64_t sparse_dim) {
  at::Tensor lin = indices.select(0, 0);
  for (int64_t d = 1; d < sparse_dim; ++d) lin = lin.mul(sizes[d]).add(indices.select(0, d));
  return lin;
}

// [sparse_dim, n] coordinates of flat positions `lin` (the inverse of flat_positions).
at::Tensor coordinates(at::Tensor lin, at::IntArrayRef sizes, int64_t sparse_dim) {
  std::vector<at::Tensor> rows(sparse_dim);
  for (int64_t d = sparse_dim - 1; d >= 0; --d) {
    rows[d] = d == 0 ? lin : lin.remainder(sizes[d]);
    if (d > 0) lin = lin.div(sizes[d], "floor");
  }
  return at::stack(rows, 0);
}

at::Tensor make_coo(const at::Tensor& indices, const at::Tensor& values, at::IntArrayRef sizes, bool coalesced) {
  at::Tensor r = at::_sparse_coo_tensor_unsafe(indices, values, sizes,
                                               values.options().layout(at::kSparse));
  r._coalesced_(coalesced);
  return r;
}

// The index list that addresses a COO tensor's entries in a dense tensor of its shape.
c10::List<std::optional<at::Tensor>> entry_index(const at::Tensor& indices) {
  c10::List<std::optional<at::Tensor>> ix;
  for (int64_t d = 0; d < indices.size(0); ++d) ix.push_back(indices.select(0, d));
  return ix;
}

void check_same_shape(const char* op, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes(), op, ": expected 'self' and 'other' to have same size, but self has size ",
              a.sizes(), " while other has size ", b.sizes(), " (FYI: op2-sparse addition does not currently ",
              "support broadcasting)");
}

// ---- coalesce: entries sorted by position, duplicates summed ----

at::Tensor coalesce_tpu(const at::Tensor& self) {
  const int64_t nnz = self._nnz(), sd = self.sparse_dim();
  at::Tensor idx = self._indices(), val = self._values();
  if (nnz < 2) return make_coo(idx.clone(), val.clone(), self.sizes(), true);
  if (sd == 0) return make_coo(idx.narrow(1, 0, 1).clone(), val.sum(0, true).to(val.scalar_type()), self.sizes(), true);
  at::Tensor lin = flat_positions(idx, self.sizes(), sd);
  auto [uniq, inverse, counts] = at::_unique2(lin, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/false);
  std::vector<int64_t> vshape(val.sizes().begin(), val.sizes().end());
  vshape[0] = uniq.size(0);
  at::Tensor summed = at::zeros(vshape, val.options()).index_add_(0, inverse, val);
  return make_coo(coordinates(uniq, self.sizes(), sd), summed, self.sizes(), true);
}

// ---- dense += alpha * sparse ----

void add_sparse_into_dense(at::Tensor& dense, const at::Tensor& sparse, const at::Scalar& alpha) {
  if (sparse._nnz() == 0) return;
  at::Tensor val = sparse._values();
  if (!(alpha.isIntegral(true) && alpha.toLong() == 1)) val = val.mul(alpha);
  val = val.to(dense.scalar_type());
  if (sparse.sparse_dim() == 0) {
    dense.add_(val.sum(0));
    return;
  }
  dense.index_put_(entry_index(sparse._indices()), val, /*accumulate=*/true);
}

at::Tensor to_dense_tpu(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<bool>) {
  TORCH_CHECK(!dtype.has_value(), "dtype argument is not supported by sparse_to_dense");
  at::Tensor out = at::zeros(self.sizes(), self._values().options());
  add_sparse_into_dense(out, self, 1);
  return out;
}

// ---- add / sub ----

// Both sparse: entries of both, the other's scaled (duplicates stay until coalesced).
at::Tensor add_sparse_sparse(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha,
                             at::ScalarType dtype) {
  check_same_shape("add", self, other);
  TORCH_CHECK(self.sparse_dim() == other.sparse_dim(), "add: expected 'self' and 'other' to have same sparse ",
              "dimensions, but self has ", self.sparse_dim(), " and other has ", other.sparse_dim());
  at::Tensor ov = other._values();
  if (!(alpha.isIntegral(true) && alpha.toLong() == 1)) ov = ov.mul(alpha);
  if (other._nnz() == 0) return make_coo(self._indices().clone(), self._values().to(dtype, false, true), self.sizes(), self.is_coalesced());
  if (self._nnz() == 0) return make_coo(other._indices().clone(), ov.to(dtype, false, true), self.sizes(), other.is_coalesced());
  at::Tensor r = make_coo(at::cat({self._indices(), other._indices()}, 1),
                          at::cat({self._values().to(dtype), ov.to(dtype)}, 0), self.sizes(), false);
  // As on CPU: the sum of two coalesced tensors is coalesced (merged), else entries stay.
  return self.is_coalesced() && other.is_coalesced() ? coalesce_tpu(r) : r;
}

void check_add_operands(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(!(self.is_sparse() && !other.is_sparse()),
              "add(sparse, dense) is not supported. Use add(dense, sparse) instead.");
}

// Makes `out` (sparse) hold `r`'s entries.
void assign_sparse(const at::Tensor& out, const at::Tensor& r) {
  if (out.is_same(r)) return;
  out.sparse_resize_(r.sizes(), r.sparse_dim(), r.dense_dim());
  at::Tensor v = r._values();
  if (v.scalar_type() != out.scalar_type()) v = v.to(out.scalar_type());
  at::sparse::alias_into_sparse(out, r._indices(), v);
  out._coalesced_(r.is_coalesced());
}

at::Tensor& add_out_tpu(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha, at::Tensor& out) {
  check_add_operands(self, other);
  if (!self.is_sparse()) {  // dense + sparse -> dense
    TORCH_CHECK(!out.is_sparse(), "add: expected a dense result for dense + sparse, got a sparse 'out'");
    check_same_shape("add", self, other);
    at::ScalarType common = at::result_type(self, other);
    TORCH_CHECK(at::canCast(common, out.scalar_type()), "result type ", common, " can't be cast to the desired output type ",
                out.scalar_type());
    if (!out.is_same(self)) {
      out.resize_(self.sizes());
      out.copy_(self);
    }
    add_sparse_into_dense(out, other, alpha);
    return out;
  }
  TORCH_CHECK(out.is_sparse(), "add: expected a sparse 'out' for sparse + sparse");
  assign_sparse(out, add_sparse_sparse(self, other, alpha, out.scalar_type()));
  return out;
}

at::Tensor add_tpu(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  check_add_operands(self, other);
  at::ScalarType common = at::result_type(self, other);
  if (!self.is_sparse()) {
    check_same_shape("add", self, other);
    at::Tensor out = self.to(common, /*non_blocking=*/false, /*copy=*/true, at::MemoryFormat::Contiguous);
    add_sparse_into_dense(out, other, alpha);
    return out;
  }
  return add_sparse_sparse(self, other, alpha, common);
}

at::Tensor& add_inplace_tpu(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return add_out_tpu(self, other, alpha, self);
}

at::Scalar negated(const at::Scalar& a) {
  if (a.isBoolean()) TORCH_CHECK(false, "Subtraction, the `-` operator, with a bool tensor is not supported.");
  return a.isIntegral(false) ? at::Scalar(-a.toLong()) : a.isComplex() ? at::Scalar(-a.toComplexDouble()) : at::Scalar(-a.toDouble());
}

at::Tensor sub_tpu(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return add_tpu(self, other, negated(alpha));
}
at::Tensor& sub_inplace_tpu(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  return add_out_tpu(self, other, negated(alpha), self);
}
at::Tensor& sub_out_tpu(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha, at::Tensor& out) {
  return add_out_tpu(self, other, negated(alpha), out);
}

// ---- entries of one operand matched in another (coalesced) sparse tensor ----

// For each flat position in `want` ([m]), the row of `have` (coalesced, flat positions
// `have_lin` [n]) at that position: (row clamped to [0, n), found).
std::pair<at::Tensor, at::Tensor> match_positions(const at::Tensor& have_lin, const at::Tensor& want) {
  int64_t n = have_lin.size(0);
  at::Tensor pos = at::searchsorted(have_lin, want).clamp_max(n - 1);
  at::Tensor found = have_lin.index_select(0, pos).eq(want);
  return {pos, found};
}

// Values of `t` (dense or sparse, same shape as mask) at `mask`'s entries.
at::Tensor values_at(const at::Tensor& t, const at::Tensor& mask) {
  at::Tensor midx = mask._indices();
  if (!t.is_sparse()) {
    if (mask.sparse_dim() == 0) return t.unsqueeze(0).expand(mask._values().sizes()).clone();
    return t.index(entry_index(midx));
  }
  TORCH_CHECK(t.sparse_dim() == mask.sparse_dim(), "sparse_mask: expected self and mask to have the same sparse ",
              "dimensions, got ", t.sparse_dim(), " and ", mask.sparse_dim());
  at::Tensor tc = t.coalesce();
  std::vector<int64_t> vshape(tc._values().sizes().begin(), tc._values().sizes().end());
  vshape[0] = mask._nnz();
  if (tc._nnz() == 0) return at::zeros(vshape, tc._values().options());
  if (mask.sparse_dim() == 0) return tc._values().expand(vshape).clone();
  auto [pos, found] = match_positions(flat_positions(tc._indices(), t.sizes(), t.sparse_dim()),
                                      flat_positions(midx, mask.sizes(), mask.sparse_dim()));
  at::Tensor v = tc._values().index_select(0, pos);
  std::vector<int64_t> fshape(v.dim(), 1);
  fshape[0] = -1;
  return at::where(found.view(fshape), v, at::zeros({}, v.options()));
}

at::Tensor sparse_mask_tpu(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.is_sparse(), "sparse_mask expects mask to be a sparse COO tensor, got ", mask.layout());
  TORCH_CHECK(self.sizes() == mask.sizes(), "sparse_mask(): operands have incompatible sizes; self has size ",
              self.sizes(), " but mask has size ", mask.sizes());
  if (self.is_same(mask)) return self;
  return make_coo(mask._indices().clone(), values_at(self, mask).to(self.scalar_type()), mask.sizes(),
                  mask.is_coalesced());
}

// ---- mul / div ----

bool is_scalar_like(const at::Tensor& t) { return !t.is_sparse() && t.dim() == 0; }

at::Tensor mul_tpu(const at::Tensor& self, const at::Tensor& other) {
  at::ScalarType common = at::result_type(self, other);
  const at::Tensor& s = self.is_sparse() ? self : other;
  const at::Tensor& o = self.is_sparse() ? other : self;
  if (is_scalar_like(o)) {
    at::Tensor k = o.device() == s.device() ? o : o.to(s.device());
    return make_coo(s._indices().clone(), s._values().mul(k).to(common), s.sizes(), s.is_coalesced());
  }
  TORCH_CHECK(s.sizes() == o.sizes(), "mul: a sparse COO tensor on tpu multiplies a scalar, or a tensor of its ",
              "own size (got ", self.sizes(), " and ", other.sizes(), "); for broadcasting use .to_dense()");
  if (!o.is_sparse()) {
    at::Tensor v = values_at(o, s);
    return make_coo(s._indices().clone(), s._values().mul(v).to(common), s.sizes(), s.is_coalesced());
  }
  // sparse * sparse: the entries present in both, each product once (coalesced).
  TORCH_CHECK(self.sparse_dim() == other.sparse_dim(), "mul: expected the operands to have the same sparse dims");
  at::Tensor a = self.coalesce(), b = other.coalesce();
  if (a._nnz() == 0 || b._nnz() == 0) {
    at::Tensor e = a._nnz() == 0 ? a : b;
    return make_coo(e._indices().narrow(1, 0, 0).clone(), e._values().narrow(0, 0, 0).to(common, false, true),
                    self.sizes(), true);
  }
  int64_t sd = a.sparse_dim();
  at::Tensor la = flat_positions(a._indices(), a.sizes(), sd);
  auto [pos, found] = match_positions(flat_positions(b._indices(), b.sizes(), sd), la);
  at::Tensor keep = found.nonzero().squeeze(1);
  at::Tensor va = a._values().index_select(0, keep), vb = b._values().index_select(0, pos.index_select(0, keep));
  return make_coo(a._indices().index_select(1, keep), va.mul(vb).to(common), self.sizes(), true);
}

at::Tensor& mul_out_tpu(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  TORCH_CHECK(out.is_sparse(), "mul: a product with a sparse operand on tpu is sparse; got a dense 'out' (",
              "multiply .to_dense() operands for a dense result)");
  assign_sparse(out, mul_tpu(self, other));
  return out;
}

at::Tensor& mul_inplace_tpu(at::Tensor& self, const at::Tensor& other) { return mul_out_tpu(self, other, self); }

at::Tensor div_tpu_mode(const at::Tensor& self, const at::Tensor& other, std::optional<c10::string_view> mode) {
  TORCH_CHECK(self.is_sparse() && is_scalar_like(other), "div: a sparse COO tensor on tpu divides by a scalar ",
              "only (got self ", self.layout(), " ", self.sizes(), ", other ", other.layout(), " ", other.sizes(),
              "); use .to_dense()");
  at::Tensor k = other.device() == self.device() ? other : other.to(self.device());
  // Rounding a sum is not summing the rounded duplicates: CPU coalesces first.
  at::Tensor a = mode.has_value() ? self.coalesce() : self;
  at::Tensor v = a._values().div(k, mode);
  // Dividing by zero makes the implicit zeros NaN: PyTorch then keeps only the entries.
  return make_coo(a._indices().clone(), v, self.sizes(), a.is_coalesced());
}
at::Tensor div_tpu(const at::Tensor& self, const at::Tensor& other) { return div_tpu_mode(self, other, std::nullopt); }
at::Tensor& div_out_tpu_mode(const at::Tensor& self, const at::Tensor& other, std::optional<c10::string_view> mode,
                             at::Tensor& out) {
  TORCH_CHECK(out.is_sparse(), "div: a sparse quotient needs a sparse 'out'");
  assign_sparse(out, div_tpu_mode(self, other, mode));
  return out;
}
at::Tensor& div_out_tpu(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  return div_out_tpu_mode(self, other, std::nullopt, out);
}
at::Tensor& div_inplace_tpu(at::Tensor& self, const at::Tensor& other) { return div_out_tpu(self, other, self); }
at::Tensor& div_inplace_tpu_mode(at::Tensor& self, const at::Tensor& other, std::optional<c10::string_view> mode) {
  return div_out_tpu_mode(self, other, mode, self);
}

// ---- sparse @ dense ----

void check_mm_operand(const char* op, const at::Tensor& s) {
  TORCH_CHECK(s.dim() == 2 && s.sparse_dim() == 2 && s.dense_dim() == 0, op, ": a sparse COO operand on tpu ",
              "must be a matrix with 2 sparse dims and no dense dims, got sizes ", s.sizes(), " sparse_dim ",
              s.sparse_dim(), " dense_dim ", s.dense_dim());
}

// mat1 @ mat2 where exactly one is sparse (2-D COO), in the promoted dtype.
at::Tensor sparse_dense_product(const char* op, const at::Tensor& mat1, const at::Tensor& mat2) {
  TORCH_CHECK(!(mat1.is_sparse() && mat2.is_sparse()), op, ": sparse @ sparse is not supported on tpu; use ",
              "a.to_dense() @ b (or .cpu())");
  TORCH_CHECK(mat1.dim() == 2 && mat2.dim() == 2, op, ": expected 2-D operands, got ", mat1.dim(), "-D and ",
              mat2.dim(), "-D");
  TORCH_CHECK(mat1.size(1) == mat2.size(0), op, ": mat1 and mat2 shapes cannot be multiplied (", mat1.size(0), "x",
              mat1.size(1), " and ", mat2.size(0), "x", mat2.size(1), ")");
  TORCH_CHECK(mat1.scalar_type() == mat2.scalar_type(), op, ": expected mat1 and mat2 to have the same dtype, got ",
              mat1.scalar_type(), " and ", mat2.scalar_type());
  if (mat1.is_sparse()) {
    check_mm_operand(op, mat1);
    at::Tensor out = at::zeros({mat1.size(0), mat2.size(1)}, mat2.options());
    if (mat1._nnz() == 0) return out;
    at::Tensor idx = mat1._indices();
    at::Tensor rows = mat2.index_select(0, idx.select(0, 1)).mul(mat1._values().unsqueeze(1));
    return out.index_add_(0, idx.select(0, 0), rows);
  }
  check_mm_operand(op, mat2);
  at::Tensor out = at::zeros({mat1.size(0), mat2.size(1)}, mat1.options());
  if (mat2._nnz() == 0) return out;
  at::Tensor idx = mat2._indices();
  at::Tensor cols = mat1.index_select(1, idx.select(0, 0)).mul(mat2._values().unsqueeze(0));
  return out.index_add_(1, idx.select(0, 1), cols);
}

at::Tensor mm_tpu(const at::Tensor& self, const at::Tensor& mat2) { return sparse_dense_product("mm", self, mat2); }

at::Tensor& mm_out_tpu(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  TORCH_CHECK(!out.is_sparse(), "mm: a sparse 'out' is not supported on tpu");
  at::Tensor r = sparse_dense_product("mm", self, mat2);
  out.resize_(r.sizes());
  return out.copy_(r);
}

at::Tensor addmm_tpu(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const at::Scalar& beta,
                     const at::Scalar& alpha) {
  TORCH_CHECK(!self.is_sparse(), "addmm: a sparse 'self' is not supported on tpu; use self.to_dense()");
  at::Tensor p = sparse_dense_product("addmm", mat1, mat2);
  at::Tensor base = self.expand(p.sizes());
  bool beta_zero = beta.isIntegral(true) ? beta.toLong() == 0 : beta.toDouble() == 0.0;
  at::Tensor scaled = alpha.equal(1) ? p : p.mul(alpha);
  return beta_zero ? scaled.clone() : base.mul(beta).add(scaled);
}

at::Tensor& addmm_out_tpu(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                          const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  at::Tensor r = addmm_tpu(self, mat1, mat2, beta, alpha);
  out.resize_(r.sizes());
  return out.copy_(r);
}

at::Tensor& addmm_inplace_tpu(at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                              const at::Scalar& beta, const at::Scalar& alpha) {
  return self.copy_(addmm_tpu(self, mat1, mat2, beta, alpha));
}

// ---- layout conversions ----

[[noreturn]] void refuse_layout(const char* op, at::Layout layout) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_tpu: ", op, ": the ", layout, " layout is not supported on tpu (only ",
                              "sparse COO, torch.sparse_coo, is); keep the tensor dense, use to_sparse() for COO, ",
                              "or convert on the CPU (.cpu())");
}

at::Tensor dense_to_coo(const at::Tensor& self, int64_t sparse_dim) {
  TORCH_CHECK(sparse_dim >= 0 && sparse_dim <= self.dim(), "dense_to_sparse: sparse_dim argument must be in [0,",
              self.dim(), "] range, but ", sparse_dim, " is given");
  TORCH_CHECK(sparse_dim > 0 || self.dim() == 0, "dense_to_sparse: sparse_dim argument must be in >0 when "
              "self.dim()>0");
  if (sparse_dim == 0) {
    at::Tensor idx = at::zeros({0, 1}, self.options().dtype(at::kLong));
    return make_coo(idx, self.unsqueeze(0).clone(), self.sizes(), true);
  }
  at::Tensor nz = self.ne(0);
  if (self.dim() > sparse_dim) nz = nz.flatten(sparse_dim).any(-1);
  at::Tensor idx = nz.nonzero().t().contiguous();  // row-major order: coalesced
  return make_coo(idx, self.index(entry_index(idx)), self.sizes(), true);
}

at::Tensor to_sparse_dim_tpu(const at::Tensor& self, int64_t sparse_dim) {
  if (self.is_sparse()) {
    TORCH_CHECK(sparse_dim == self.sparse_dim(), "to_sparse: conversion from Sparse to Sparse with sparse_dim ",
                "argument !=self.sparse_dim() is not supported");
    return self;
  }
  return dense_to_coo(self, sparse_dim);
}

at::Tensor to_sparse_tpu(const at::Tensor& self, std::optional<at::Layout> layout, at::OptionalIntArrayRef blocksize,
                         std::optional<int64_t> dense_dim) {
  at::Layout l = layout.value_or(at::kSparse);
  if (l != at::kSparse) refuse_layout("to_sparse", l);
  TORCH_CHECK(!blocksize.has_value(), "to_sparse for Strided to Sparse conversion does not use specified blocksize");
  if (self.is_sparse()) {
    TORCH_CHECK(!dense_dim.has_value() || *dense_dim == self.dense_dim(), "to_sparse: conversion from Sparse to ",
                "Sparse with dense_dim argument !=self.dense_dim() is not supported");
    return self;
  }
  TORCH_CHECK(self.dim() == 0 || dense_dim.value_or(0) != self.dim(), "dense_to_sparse: dense_dim argument must be "
              "!=self.dim() when self.dim()>0");
  return dense_to_coo(self, self.dim() - dense_dim.value_or(0));
}

at::Tensor to_csr_tpu(const at::Tensor& self, std::optional<int64_t>) { refuse_layout("to_sparse_csr", at::kSparseCsr); }
at::Tensor to_csc_tpu(const at::Tensor& self, std::optional<int64_t>) { refuse_layout("to_sparse_csc", at::kSparseCsc); }
at::Tensor to_bsr_tpu(const at::Tensor& self, at::IntArrayRef, std::optional<int64_t>) {
  refuse_layout("to_sparse_bsr", at::kSparseBsr);
}
at::Tensor to_bsc_tpu(const at::Tensor& self, at::IntArrayRef, std::optional<int64_t>) {
  refuse_layout("to_sparse_bsc", at::kSparseBsc);
}

// ---- refusals ----

std::string op_name(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

void sparse_coo_refusal(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_tpu: ", op_name(op), " is not supported for sparse COO tensors on tpu. ",
                              "Supported: construction, indices/values, coalesce, to_dense/to_sparse, add/sub (dense + sparse, ",
                              "sparse + sparse), mul (scalar, same-size dense or sparse), div by a scalar, sparse_mask, ",
                              "sparse @ dense (mm/addmm/mv), sum, norm, pow, cat, permute, narrow_copy, unary ufuncs, ",
                              "copies between devices. Use t.to_dense() for a dense tensor (or t.cpu() "
                              "for PyTorch's CPU sparse kernels)");
}

void sparse_compressed_refusal(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  std::string layout = "compressed sparse (CSR/CSC/BSR/BSC)";
  const size_t nargs = op.schema().arguments().size();
  for (size_t i = stack->size() - nargs; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().layout() != at::kStrided) {
      std::ostringstream os;
      os << v.toTensor().layout();
      layout = os.str();
      break;
    }
  }
  TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_tpu: ", op_name(op), ": the ", layout, " layout is not supported on tpu ",
                              "(only sparse COO, torch.sparse_coo, is); use a dense tensor, to_sparse() for COO, or ",
                              "the CPU (.cpu())");
}

// Building a compressed tensor on tpu (torch.sparse_csr_tensor(..., device="tpu"), or
// .to("tpu") of a CPU one): PyTorch's composite constructors would make one no kernel
// here can use; the constructor is refused, naming the layout.
void compressed_constructor_refusal(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  std::string layout;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = (*stack)[first + i];
    if (args[i].name() == "layout" && v.isInt()) {
      std::ostringstream os;
      os << static_cast<at::Layout>(v.toInt());
      layout = os.str();
    }
  }
  const std::string& n = op.operator_name().name;
  for (const char* k : {"csr", "csc", "bsr", "bsc"})
    if (layout.empty() && n.find(std::string("_") + k + "_") != std::string::npos) {
      layout = std::string("Sparse") + char(std::toupper(k[0])) + (k + 1);
    }
  if (layout.empty()) layout = "compressed sparse (CSR/CSC/BSR/BSC)";
  TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_tpu: ", op_name(op), ": the ", layout, " layout is not supported on tpu ",
                              "(only sparse COO, torch.sparse_coo, is); build a COO tensor (torch.sparse_coo_tensor, ",
                              "or .to_sparse() of a dense one), keep it dense, or keep it on the CPU");
}

constexpr const char* kCompressedConstructors[] = {
    "sparse_compressed_tensor.comp_plain_value_size", "sparse_compressed_tensor.comp_plain_value",
    "sparse_csr_tensor.crow_col_value_size", "sparse_csr_tensor.crow_col_value",
    "sparse_csc_tensor.ccol_row_value_size", "sparse_csc_tensor.ccol_row_value",
    "sparse_bsr_tensor.crow_col_value_size", "sparse_bsr_tensor.crow_col_value",
    "sparse_bsc_tensor.ccol_row_value_size", "sparse_bsc_tensor.ccol_row_value",
    "_sparse_compressed_tensor_unsafe", "_sparse_csr_tensor_unsafe", "_sparse_csc_tensor_unsafe",
    "_sparse_bsr_tensor_unsafe", "_sparse_bsc_tensor_unsafe", "_sparse_compressed_tensor_with_dims"};

void refuse_compressed_constructors(torch::Library& m) {
  for (const char* name : kCompressedConstructors)
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&compressed_constructor_refusal>());
}

}  // namespace

// An op whose lowering covers its dense form only and whose sparse form PyTorch composes
// from other ops, as its CPU and CUDA kernels do: _embedding_bag_backward with sparse=True
// (EmbeddingBag(sparse=True)) becomes _embedding_bag_sparse_backward, which builds the COO
// gradient with ops that run here.
bool wants_sparse_variant(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& name = op.operator_name();
  if (name.name != "aten::_embedding_bag_backward" || !name.overload_name.empty()) return false;
  return stack[stack.size() - op.schema().arguments().size() + 9].toBool();
}

void run_sparse_variant(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t first = stack->size() - op.schema().arguments().size();
  auto a = [&](size_t i) -> c10::IValue& { return (*stack)[first + i]; };
  // (grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
  //  scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx)
  std::optional<at::Tensor> psw = a(10).toOptional<at::Tensor>();
  at::Tensor r = at::_embedding_bag_sparse_backward_symint(
      a(0).toTensor(), a(1).toTensor(), a(2).toTensor(), a(3).toTensor(), a(4).toTensor(), a(6).toSymInt(),
      a(7).toBool(), a(8).toInt(), psw, a(11).toInt());
  torch::jit::drop(*stack, op.schema().arguments().size());
  stack->emplace_back(std::move(r));
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { refuse_compressed_constructors(m); }

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  // PyTorch's device-generic COO kernels (as registered for SparseCUDA).
  m.impl("_sparse_coo_tensor_with_dims", TORCH_FN(at::native::new_with_dims_sparse));
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(at::native::new_with_dims_and_tensor_sparse_symint));
  m.impl("empty.memory_format", TORCH_FN(at::native::empty_sparse_symint));
  m.impl("empty_like", TORCH_FN(at::native::empty_like_sparse_coo));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  m.impl("sparse_resize_", TORCH_FN(at::native::sparse_resize_));
  m.impl("sparse_resize_and_clear_", TORCH_FN(at::native::sparse_resize_and_clear_));
  m.impl("resize_as_sparse_", TORCH_FN(at::native::resize_as_sparse_));
  m.impl("clone", TORCH_FN(at::native::clone_sparse));
  m.impl("zero_", TORCH_FN(at::native::zero_sparse_));
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_wrapper_));
  m.impl("copy_sparse_to_sparse_", TORCH_FN(at::native::copy_sparse_));
  m.impl("unsqueeze", TORCH_FN(at::native::unsqueeze_sparse));
#define TPU_SPARSE_UNARY(op)                                \
  m.impl(#op, TORCH_FN(at::native::op##_sparse));           \
  m.impl(#op ".out", TORCH_FN(at::native::op##_sparse_out)); \
  m.impl(#op "_", TORCH_FN(at::native::op##_sparse_));
  TPU_SPARSE_UNARY(abs)
  TPU_SPARSE_UNARY(asin)
  TPU_SPARSE_UNARY(asinh)
  TPU_SPARSE_UNARY(atan)
  TPU_SPARSE_UNARY(atanh)
  TPU_SPARSE_UNARY(ceil)
  TPU_SPARSE_UNARY(deg2rad)
  TPU_SPARSE_UNARY(erf)
  TPU_SPARSE_UNARY(erfinv)
  TPU_SPARSE_UNARY(expm1)
  TPU_SPARSE_UNARY(floor)
  TPU_SPARSE_UNARY(frac)
  TPU_SPARSE_UNARY(log1p)
  TPU_SPARSE_UNARY(rad2deg)
  TPU_SPARSE_UNARY(round)
  TPU_SPARSE_UNARY(sgn)
  TPU_SPARSE_UNARY(sign)
  TPU_SPARSE_UNARY(sin)
  TPU_SPARSE_UNARY(sinh)
  TPU_SPARSE_UNARY(sqrt)
  TPU_SPARSE_UNARY(tan)
  TPU_SPARSE_UNARY(tanh)
  TPU_SPARSE_UNARY(trunc)
#undef TPU_SPARSE_UNARY
  m.impl("neg", TORCH_FN(at::native::neg_sparse));
  m.impl("neg.out", TORCH_FN(at::native::neg_out_sparse));
  m.impl("neg_", TORCH_FN(at::native::neg_sparse_));
  m.impl("relu", TORCH_FN(at::native::relu_sparse));
  m.impl("relu_", TORCH_FN(at::native::relu_sparse_));
  m.impl("isnan", TORCH_FN(at::native::isnan_sparse));
  m.impl("isinf", TORCH_FN(at::native::isinf_sparse));
  m.impl("nan_to_num", TORCH_FN(at::native::nan_to_num_sparse));
  m.impl("nan_to_num.out", TORCH_FN(at::native::nan_to_num_sparse_out));
  m.impl("nan_to_num_", TORCH_FN(at::native::nan_to_num_sparse_));
  m.impl("pow.Tensor_Scalar", TORCH_FN(at::native::pow_sparse_scalar));
  m.impl("pow.Tensor_Scalar_out", TORCH_FN(at::native::pow_out_sparse_scalar));
  m.impl("sum", TORCH_FN(at::native::sum_coo));
  m.impl("sum.dim_IntList", TORCH_FN(at::native::sum_sparse_coo));
  m.impl("any", TORCH_FN(at::native::any_sparse));
  m.impl("norm.ScalarOpt_dim", TORCH_FN(at::native::sparse_norm));
  m.impl("norm.ScalarOpt_dim_dtype", TORCH_FN(at::native::sparse_dtype_norm));
  m.impl("native_norm", TORCH_FN(static_cast<at::Tensor (*)(const at::Tensor&, const at::Scalar&)>(at::native::norm_sparse)));
  m.impl("native_norm.ScalarOpt_dim_dtype",
         TORCH_FN(static_cast<at::Tensor (*)(const at::Tensor&, const std::optional<at::Scalar>&, at::IntArrayRef, bool,
                                             std::optional<at::ScalarType>)>(at::native::norm_sparse)));
  m.impl("permute", TORCH_FN(at::native::permute_sparse_coo));
  m.impl("cat", TORCH_FN(at::native::cat_sparse));
  m.impl("narrow_copy", TORCH_FN(at::native::narrow_copy_sparse));
  m.impl("mv", TORCH_FN(at::native::mv_sparse));

  // Ours, from dense ops.
  m.impl("_coalesce", TORCH_FN(coalesce_tpu));
  m.impl("_to_dense", TORCH_FN(to_dense_tpu));
  m.impl("add.Tensor", TORCH_FN(add_tpu));
  m.impl("add_.Tensor", TORCH_FN(add_inplace_tpu));
  m.impl("add.out", TORCH_FN(add_out_tpu));
  m.impl("sub.Tensor", TORCH_FN(sub_tpu));
  m.impl("sub_.Tensor", TORCH_FN(sub_inplace_tpu));
  m.impl("sub.out", TORCH_FN(sub_out_tpu));
  m.impl("mul.Tensor", TORCH_FN(mul_tpu));
  m.impl("mul_.Tensor", TORCH_FN(mul_inplace_tpu));
  m.impl("mul.out", TORCH_FN(mul_out_tpu));
  m.impl("div.Tensor", TORCH_FN(div_tpu));
  m.impl("div_.Tensor", TORCH_FN(div_inplace_tpu));
  m.impl("div.out", TORCH_FN(div_out_tpu));
  m.impl("div.Tensor_mode", TORCH_FN(div_tpu_mode));
  m.impl("div_.Tensor_mode", TORCH_FN(div_inplace_tpu_mode));
  m.impl("div.out_mode", TORCH_FN(div_out_tpu_mode));
  m.impl("sparse_mask", TORCH_FN(sparse_mask_tpu));
  m.impl("mm", TORCH_FN(mm_tpu));
  m.impl("mm.out", TORCH_FN(mm_out_tpu));
  m.impl("addmm", TORCH_FN(addmm_tpu));
  m.impl("addmm.out", TORCH_FN(addmm_out_tpu));
  m.impl("addmm_", TORCH_FN(addmm_inplace_tpu));
  m.impl("_to_sparse.sparse_dim", TORCH_FN(to_sparse_dim_tpu));
  m.impl("_to_sparse", TORCH_FN(to_sparse_tpu));
  m.impl("_to_sparse_csr", TORCH_FN(to_csr_tpu));
  m.impl("_to_sparse_csc", TORCH_FN(to_csc_tpu));
  m.impl("_to_sparse_bsr", TORCH_FN(to_bsr_tpu));
  m.impl("_to_sparse_bsc", TORCH_FN(to_bsc_tpu));
}

// A dense tpu tensor to sparse: COO on the device, compressed layouts refused.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_to_sparse.sparse_dim", TORCH_FN(to_sparse_dim_tpu));
  m.impl("_to_sparse", TORCH_FN(to_sparse_tpu));
  m.impl("_to_sparse_csr", TORCH_FN(to_csr_tpu));
  m.impl("_to_sparse_csc", TORCH_FN(to_csc_tpu));
  m.impl("_to_sparse_bsr", TORCH_FN(to_bsr_tpu));
  m.impl("_to_sparse_bsc", TORCH_FN(to_bsc_tpu));
  refuse_compressed_constructors(m);
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) { refuse_compressed_constructors(m); }

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_coo_refusal>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_compressed_refusal>());
}

}  // namespace tpu::backend
