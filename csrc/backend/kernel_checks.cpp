#include "backend/kernel_checks.h"

#include "backend/dtype_support.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/ExpandUtils.h>
#include <ATen/native/TypeProperties.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

namespace tpu::backend {

namespace {

// A Scalar argument. IValue::isScalar leaves out an integer above INT64_MAX (a uint64
// value, which toScalar gives back).
bool is_scalar(const c10::IValue& v) { return v.isScalar() || v.isUnsigned(); }

// The tensors among index / index_put_'s indices (a None entry is an undefined one).
std::vector<at::Tensor> index_list(const c10::IValue& list) {
  std::vector<at::Tensor> out;
  for (const c10::IValue& i : list.toListRef())
    out.push_back(i.isTensor() ? i.toTensor() : at::Tensor());
  return out;
}

bool is_mask_index(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte);
}

// index_put_(self, indices, values[, accumulate]) with one value on the CPU through one
// boolean mask on self's device: CPU's and CUDA's kernels fill it with masked_fill_,
// which casts the value and takes it in any shape.
bool fills_through_mask(c10::ArrayRef<c10::IValue> args) {
  const at::Tensor& v = args[2].toTensor();
  bool accumulate = args.size() > 3 && args[3].isBool() && args[3].toBool();
  if (accumulate || v.numel() != 1 || !v.is_cpu() || !args[1].isList()) return false;
  int masks = 0, others = 0;
  for (const at::Tensor& t : index_list(args[1])) {
    if (!t.defined()) continue;
    (is_mask_index(t) && t.device() == args[0].toTensor().device() ? masks : others) += 1;
  }
  return masks == 1 && others == 0;
}

// index / index_put_: CPU's kernels take integer indices as int64 or int32 (a float one
// would otherwise be truncated), and masks as bool or uint8.
void index_dtypes(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[1].isList()) return;
  for (const at::Tensor& t : index_list(args[1])) {
    if (!t.defined()) continue;
    c10::ScalarType s = t.scalar_type();
    TORCH_CHECK_INDEX(s == at::kLong || s == at::kInt || s == at::kByte || s == at::kBool,
                      "tensors used as indices must be long, int, byte or bool tensors");
  }
}

// index / index_put_(self, indices, ...): each boolean mask among the indices covers as
// many of self's dimensions as it has, and must match their sizes (CPU's check; a smaller
// mask's coordinates would index the larger tensor, and a size-1 mask would broadcast).
void index_mask_shapes(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[0].isTensor() || !args[1].isList()) return;
  const at::Tensor& self = args[0].toTensor();
  int64_t dim = 0;  // self's dimension the next index starts at
  for (const at::Tensor& t : index_list(args[1])) {
    if (!is_mask_index(t)) {
      ++dim;
      continue;
    }
    for (int64_t j = 0; j < t.dim(); ++j, ++dim) {
      TORCH_CHECK_INDEX(dim < self.dim(), "Dimension out of range (expected to be in range of [", -self.dim(),
                        ", ", self.dim() - 1, "], but got ", dim, ")");
      TORCH_CHECK_INDEX(t.size(j) == self.size(dim), "The shape of the mask ", t.sizes(), " at index ", j,
                        " does not match the shape of the indexed tensor ", self.sizes(), " at index ", dim);
    }
  }
}

void index_checks(c10::ArrayRef<c10::IValue> args) {
  index_dtypes(args);
  index_mask_shapes(args);
}

// A size a mask gives: how many elements it selects, known only on the device (where the
// lowering checks it against the values); here it matches any size.
constexpr int64_t kMaskCount = -1;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + (shape[i] == kMaskCount ? std::string("n") : std::to_string(shape[i]));
  return s + "]";
}

// The shape of self[indices] as CPU's index_put_ computes it (a mask becomes one index
// per dim it covers, of the count it selects; the indices broadcast together, with CPU's
// IndexError where they do not), and whether a mask's count is in it. nullopt where a
// 0-d mask (which indexes no dim) leaves the shape to the lowering.
std::optional<std::vector<int64_t>> indexing_result_shape(const at::Tensor& self,
                                                          const std::vector<at::Tensor>& indices, bool* counted) {
  std::vector<std::optional<std::vector<int64_t>>> per_dim;  // self's dims, in order, as indexed
  for (const at::Tensor& t : indices) {
    if (is_mask_index(t) && t.dim() == 0) return std::nullopt;
    if (!t.defined()) per_dim.emplace_back();
    else if (is_mask_index(t)) per_dim.insert(per_dim.end(), t.dim(), std::vector<int64_t>{kMaskCount});
    else per_dim.emplace_back(t.sizes().vec());
  }
  if (static_cast<int64_t>(per_dim.size()) > self.dim()) return std::nullopt;  // raised before
  std::vector<int64_t> batch;
  bool mismatch = false;
  std::string shapes;
  for (const auto& s : per_dim) {
    if (!s) continue;
    shapes += (shapes.empty() ? "" : ", ") + shape_str(*s);
    size_t n = std::max(batch.size(), s->size());
    std::vector<int64_t> out(n);
    for (size_t i = 0; i < n; ++i) {
      int64_t a = i < n - batch.size() ? 1 : batch[i - (n - batch.size())];
      int64_t b = i < n - s->size() ? 1 : (*s)[i - (n - s->size())];
      if (a == kMaskCount || b == kMaskCount) {
        int64_t other = a == kMaskCount ? b : a;  // the count must be it, or one (device-checked)
        out[i] = other == 1 ? kMaskCount : other;
      } else {
        mismatch |= a != b && a != 1 && b != 1;
        out[i] = a == 1 ? b : a;
      }
    }
    batch = std::move(out);
  }
  TORCH_CHECK_INDEX(!mismatch, "shape mismatch: indexing tensors could not be broadcast together with shapes ",
                    shapes);
  int64_t first = -1, last = -1;
  bool adjacent = true;
  for (size_t d = 0; d < per_dim.size(); ++d) {
    if (!per_dim[d]) continue;
    if (last >= 0 && static_cast<int64_t>(d) != last + 1) adjacent = false;
    if (first < 0) first = static_cast<int64_t>(d);
    last = static_cast<int64_t>(d);
  }
  if (first < 0) return self.sizes().vec();
  // Adjacent indexed dims are replaced where they stand; apart, the broadcast index dims
  // come first (CPU transposes them to the front).
  int64_t at = adjacent ? first : 0;
  std::vector<int64_t> result;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (d == at) result.insert(result.end(), batch.begin(), batch.end());
    bool indexed = d < static_cast<int64_t>(per_dim.size()) && per_dim[d].has_value();
    if (!indexed) result.push_back(self.size(d));
  }
  for (int64_t v : batch) *counted |= v == kMaskCount;
  return result;
}

// index_put_(self, indices, values[, accumulate]): CPU's checks in its order: the number
// of indices, their dtypes, the masks' shapes, the indices broadcasting together, values
// broadcasting to self[indices] (leading dims of size 1 beyond its rank too), and
// values' dtype: CPU's and CUDA's kernels write values without a cast, except through
// masked_fill_ (fills_through_mask).
void index_put_checks(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 3 || !args[0].isTensor() || !args[1].isList() || !args[2].isTensor()) return;
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& v = args[2].toTensor();
  std::vector<at::Tensor> indices = index_list(args[1]);
  TORCH_CHECK_INDEX(static_cast<int64_t>(indices.size()) <= self.dim(), "too many indices for tensor of dimension ",
                    self.dim(), " (got ", indices.size(), ")");
  index_dtypes(args);
  index_mask_shapes(args);
  bool counted = false;
  std::optional<std::vector<int64_t>> result = indexing_result_shape(self, indices, &counted);
  if (fills_through_mask(args)) return;
  if (result) {
    bool fits = v.dim() <= static_cast<int64_t>(result->size());
    for (int64_t i = 1; fits && i <= v.dim(); ++i) {
      int64_t want = (*result)[result->size() - i], have = v.size(v.dim() - i);
      fits = have == 1 || have == want || want == kMaskCount;
    }
    TORCH_CHECK(fits, "shape mismatch: value tensor of shape ", v.sizes(),
                " cannot be broadcast to indexing result of shape ", shape_str(*result),
                counted ? " (n: the number of elements the mask selects)" : "");
  }
  c10::ScalarType s = self.scalar_type(), values = v.scalar_type();
  TORCH_CHECK(s == values, "Index put requires the source and destination dtypes match, got ", s,
              " for the destination and ", values, " for the source.");
}

// pow(Tensor self, Scalar exponent): an integer tensor to a negative integer power.
void pow_exponent(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[0].isTensor() || !is_scalar(args[1])) return;
  const c10::Scalar e = args[1].toScalar();
  TORCH_CHECK(!(c10::isIntegralType(args[0].toTensor().scalar_type(), /*includeBool=*/true) &&
                e.isIntegral(/*includeBool=*/true) && e.toLong() < 0),
              "Integers to negative integer powers are not allowed.");
}

// _foreach_pow(Tensor[] self, Scalar or Scalar[] exponent): pow's check, element by element.
void foreach_pow_exponent(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[0].isTensorList()) return;
  auto selves = args[0].toTensorList();
  bool scalars = args[1].isList() && !args[1].isTensorList();
  for (size_t k = 0; k < selves.size(); ++k) {
    if (is_scalar(args[1])) {
      pow_exponent({c10::IValue(selves.get(k)), args[1]});
    } else if (scalars && k < args[1].toListRef().size()) {
      pow_exponent({c10::IValue(selves.get(k)), args[1].toListRef()[k]});
    }
  }
}

// softshrink(self, lambd): lambd in [0, the largest finite value of self's dtype].
void softshrink_lambda(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[0].isTensor() || !is_scalar(args[1])) return;
  c10::ScalarType t = args[0].toTensor().scalar_type();
  double upper = std::numeric_limits<double>::max();
  if (t == at::kFloat) upper = std::numeric_limits<float>::max();
  if (t == at::kBFloat16) upper = std::numeric_limits<c10::BFloat16>::max();
  if (t == at::kHalf) upper = std::numeric_limits<c10::Half>::max();
  double lambd = args[1].toScalar().toDouble();
  TORCH_CHECK(lambd >= 0 && lambd <= upper, "lambda must be in range [0, ", upper, "] for input dtype ", t,
              ", but found ", lambd);
}

// celu(self, alpha): the kernel divides by alpha.
void celu_alpha(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !is_scalar(args[1])) return;
  TORCH_CHECK(args[1].toScalar().toDouble() != 0, "ZeroDivisionError: alpha cannot be 0 for CELU");
}

// linalg_vector_norm and norm (self, ord, dim...): an order without an identity (negative
// or infinite) cannot reduce an empty tensor, nor an empty dim.
void norm_order(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[0].isTensor() || args[0].toTensor().numel() != 0 || !is_scalar(args[1])) return;
  const c10::Scalar ord = args[1].toScalar();
  double o = ord.toDouble();
  if (!(o < 0 || o == std::numeric_limits<double>::infinity())) return;
  const at::Tensor& self = args[0].toTensor();
  bool has_dims = args.size() > 2 && args[2].isIntList() && !args[2].toIntList().empty();
  TORCH_CHECK(has_dims, "linalg.vector_norm cannot compute the ", ord,
              " norm on an empty tensor because the operation does not have an identity");
  for (int64_t d : args[2].toIntList()) {
    if (d < -self.dim() || d >= std::max<int64_t>(self.dim(), 1)) continue;  // the meta kernel's error
    TORCH_CHECK(self.size(d) != 0, "linalg.vector_norm cannot compute the ", ord, " norm on the dimension ", d,
                "because this dimension is empty and the operation does not have an identity");
  }
}

// nll_loss_forward / nll_loss2d_forward(self, target, ...): CPU's kernels take class
// indices as int64 (uint8 too, but for the 2-d loss).
void nll_target_dtype(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[1].isTensor()) return;
  c10::ScalarType t = args[1].toTensor().scalar_type();
  TORCH_CHECK(t == at::kLong || t == at::kByte, "expected target dtype to be Long or Byte, but got ", t);
}
void nll2d_target_dtype(c10::ArrayRef<c10::IValue> args) {
  nll_target_dtype(args);
  TORCH_CHECK(args[1].toTensor().scalar_type() == at::kLong, "expected scalar type Long but found Byte");
}

// Matrix products take operands of one dtype on CPU (addr and matmul's outer products
// promote); each kernel words it its own way.
c10::ScalarType dtype_at(c10::ArrayRef<c10::IValue> args, size_t i) { return args[i].toTensor().scalar_type(); }
bool tensors_at(c10::ArrayRef<c10::IValue> args, std::initializer_list<size_t> is) {
  for (size_t i : is)
    if (i >= args.size() || !args[i].isTensor() || !args[i].toTensor().defined()) return false;
  return true;
}
void mm_dtypes(c10::ArrayRef<c10::IValue> args) {  // mm(self, mat2)
  if (!tensors_at(args, {0, 1})) return;
  c10::ScalarType a = dtype_at(args, 0), b = dtype_at(args, 1);
  TORCH_CHECK(a == b, "expected m1 and m2 to have the same dtype, but got: ", c10::scalarTypeToTypeMeta(a).name(),
              " != ", c10::scalarTypeToTypeMeta(b).name());
}
void bmm_dtypes(c10::ArrayRef<c10::IValue> args) {  // bmm(self, mat2[, out]): out's dtype as mat2's
  size_t first = args.size() > 2 && args[2].isTensor() ? 1 : 0;
  if (!tensors_at(args, {first, first + 1})) return;
  for (size_t i : {first + 1, size_t{0}})
    TORCH_CHECK(dtype_at(args, i) == dtype_at(args, first), "expected scalar type ", dtype_at(args, first),
                " but found ", dtype_at(args, i));
}
void addmm_dtypes(c10::ArrayRef<c10::IValue> args) {  // addmm(self, m1, m2)
  if (!tensors_at(args, {0, 1, 2})) return;
  TORCH_CHECK(dtype_at(args, 0) == dtype_at(args, 2), "self and mat2 must have the same dtype, but got ",
              dtype_at(args, 0), " and ", dtype_at(args, 2));
  TORCH_CHECK(dtype_at(args, 1) == dtype_at(args, 2), "mat1 and mat2 must have the same dtype, but got ",
              dtype_at(args, 1), " and ", dtype_at(args, 2));
}

// The add* matrix products check as CPU does, in its order and words, each its own way:
// a meta function's checks (ranks, matching sizes, dtypes), then set_output's of an out=
// tensor or an in-place self, then the kernel's, which expands self to the product's
// shape. PyTorch's Python meta functions, which tpu runs first, check in another order
// and words, and not all of self's shape (an expand checked first hid an operand
// mismatch: "The expanded size ..." for W.addmm_(A, B) with A and B swapped). An
// in-place form has a check of its own (kernel_check_for); an out= form has one more
// argument than the functional one.
const at::Tensor* out_arg(c10::ArrayRef<c10::IValue> args, size_t functional_args) {
  return args.size() > functional_args && args[functional_args].isTensor() ? &args[functional_args].toTensor()
                                                                            : nullptr;
}
// at::expand's checks of `self` to `sizes`, in its words (naming self's type as on its
// device), without making the view.
void check_expands(const at::Tensor& self, c10::IntArrayRef sizes) {
  TORCH_CHECK(sizes.size() >= static_cast<size_t>(self.dim()), "expand(", self.toString(), "{", self.sizes(),
              "}, size=", sizes, "): the number of sizes provided (", sizes.size(),
              ") must be greater or equal to the number of dimensions in the tensor (", self.dim(), ")");
  (void)at::inferExpandGeometry(self.sizes(), self.strides(), sizes);
}
// set_output's checks of a structured kernel's result: an out= tensor of the result's
// dtype (any shape: it is resized), an in-place self of its dtype and shape.
void check_out_dtype(const at::Tensor& out, c10::ScalarType dtype) {
  TORCH_CHECK(out.scalar_type() == dtype, "Expected out tensor to have dtype ", c10::scalarTypeToTypeMeta(dtype),
              ", but got ", out.dtype(), " instead");
}
void check_inplace(const at::Tensor& self, c10::IntArrayRef sizes, c10::ScalarType dtype) {
  TORCH_CHECK(self.scalar_type() == dtype, "Bad in-place call: input tensor dtype ", self.dtype(),
              " and output tensor dtype ", c10::scalarTypeToTypeMeta(dtype), " should match");
  TORCH_CHECK(self.sizes() == sizes, "Bad in-place call: input tensor size ", self.sizes(), " and output tensor size ",
              sizes, " should match");
}

// addmm(self, mat1, mat2, beta, alpha[, out]) and addmm_: out of place, self broadcasts
// to [m, n] (unchecked, the lowering failed to compile at the next read); in place, it is
// [m, n].
template <bool in_place>
void addmm_checks(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 1, 2})) return;
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& m1 = args[1].toTensor();
  const at::Tensor& m2 = args[2].toTensor();
  addmm_dtypes(args);
  TORCH_CHECK(m1.dim() == 2, "mat1 must be a matrix, got ", m1.dim(), "-D tensor");
  TORCH_CHECK(m2.dim() == 2, "mat2 must be a matrix, got ", m2.dim(), "-D tensor");
  TORCH_CHECK(m1.size(1) == m2.size(0), "mat1 and mat2 shapes cannot be multiplied (", m1.size(0), "x", m1.size(1),
              " and ", m2.size(0), "x", m2.size(1), ")");
  std::vector<int64_t> sizes = {m1.size(0), m2.size(1)};
  if (in_place) {
    check_inplace(self, sizes, m1.scalar_type());
    return;
  }
  if (const at::Tensor* out = out_arg(args, 5)) check_out_dtype(*out, m1.scalar_type());
  check_expands(self, sizes);
}

// baddbmm(self, batch1, batch2, beta, alpha[, out]) and baddbmm_: CPU's meta function
// expands self first (reading the batches' sizes it has yet to check) and compares its
// dtype with batch1's; the result takes batch2's. The kernel reads the result as
// batch1's dtype where it has products to compute (past 400 of them CPU's other paths
// word a dtype mismatch otherwise).
template <bool in_place>
void baddbmm_checks(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 1, 2})) return;
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& b1 = args[1].toTensor();
  const at::Tensor& b2 = args[2].toTensor();
  check_expands(self, {b1.size(0), b1.size(1), b2.size(2)});
  TORCH_CHECK(self.dtype() == b1.dtype(), "Input dtypes must be the same, got: input ", self.dtype(), ", batch1: ",
              b1.dtype(), ", batch2: ", b2.dtype());
  TORCH_CHECK(b1.dim() == 3, "batch1 must be a 3D tensor");
  TORCH_CHECK(b2.dim() == 3, "batch2 must be a 3D tensor");
  TORCH_CHECK(b2.size(0) == b1.size(0) && b2.size(1) == b1.size(2),
              "Expected size for first two dimensions of batch2 tensor to be: [", b1.size(0), ", ", b1.size(2),
              "] but got: [", b2.size(0), ", ", b2.size(1), "].");
  std::vector<int64_t> sizes = {b1.size(0), b1.size(1), b2.size(2)};
  if (in_place) {
    check_inplace(self, sizes, b2.scalar_type());
  } else if (const at::Tensor* out = out_arg(args, 5)) {
    check_out_dtype(*out, b2.scalar_type());
  }
  bool computes = c10::multiply_integers(sizes) != 0 && b1.size(2) != 0;
  TORCH_CHECK(!computes || b2.scalar_type() == b1.scalar_type(), "expected scalar type ", b1.scalar_type(),
              " but found ", b2.scalar_type());
}

// addbmm(self, batch1, batch2, beta, alpha[, out]) and addbmm_: CPU's kernel expands self
// to [n, p], checks the batches, then runs addmm_ into the result (self's dtype, or out's)
// for each batch, whose meta function checks the dtypes. (An in-place self that only
// broadcasts is resized on CPU: the fallback does it.)
void addbmm_checks(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 1, 2})) return;
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& b1 = args[1].toTensor();
  const at::Tensor& b2 = args[2].toTensor();
  check_expands(self, {b1.size(1), b2.size(2)});
  TORCH_CHECK(b1.dim() == 3, "batch1 must be a 3D tensor");
  TORCH_CHECK(b2.dim() == 3, "batch2 must be a 3D tensor");
  TORCH_CHECK(b1.size(0) == b2.size(0), "batch1 and batch2 must have same number of batches, got ", b1.size(0),
              " and ", b2.size(0));
  TORCH_CHECK(b1.size(2) == b2.size(1), "Incompatible matrix sizes for bmm (", b1.size(1), "x", b1.size(2), " and ",
              b2.size(1), "x", b2.size(2), ")");
  if (b1.size(0) == 0) return;  // no addmm_ runs
  const at::Tensor* out = out_arg(args, 5);
  c10::ScalarType result = (out ? *out : self).scalar_type();
  TORCH_CHECK(result == b2.scalar_type(), "self and mat2 must have the same dtype, but got ", result, " and ",
              b2.scalar_type());
  TORCH_CHECK(b1.scalar_type() == b2.scalar_type(), "mat1 and mat2 must have the same dtype, but got ",
              b1.scalar_type(), " and ", b2.scalar_type());
}
// convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
// groups): CPU's shape checks the meta function skips (bias size, groups dividing the
// weight, a transposed convolution's input channels) and its dtype check.
void convolution_checks(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 9 || !tensors_at(args, {0, 1})) return;
  const at::Tensor& input = args[0].toTensor();
  const at::Tensor& weight = args[1].toTensor();
  bool transposed = args[6].toBool();
  int64_t groups = args[8].toInt();
  TORCH_CHECK(input.scalar_type() == weight.scalar_type(), "expected scalar type ", input.scalar_type(),
              " but found ", weight.scalar_type());
  // What at::_convolution checks before choosing a kernel (CPU and CUDA run it; our rule
  // sits on `convolution` above it, and the meta function checks none of this).
  const int64_t dim = weight.dim() - 2;
  auto param = [&](int i, const char* name) {
    std::vector<int64_t> v = args[i].toIntVector();
    TORCH_CHECK(v.size() == 1 || static_cast<int64_t>(v.size()) == dim, "expected ", name,
                " to be a single integer value or a list of ", dim, " values to match the convolution dimensions, "
                "but got ", name, "=", c10::IntArrayRef(v));
    if (v.size() == 1) v.assign(std::max<int64_t>(dim, 1), v[0]);
    return v;
  };
  if (dim > 0) {
    auto stride = param(3, "stride"), padding = param(4, "padding"), dilation = param(5, "dilation");
    auto output_padding = param(7, "output_padding");
    auto any = [](const std::vector<int64_t>& v, auto pred) { return std::any_of(v.begin(), v.end(), pred); };
    TORCH_CHECK(!any(padding, [](int64_t x) { return x < 0; }), "negative padding is not supported");
    TORCH_CHECK(!any(output_padding, [](int64_t x) { return x < 0; }), "negative output_padding is not supported");
    TORCH_CHECK(!any(stride, [](int64_t x) { return x <= 0; }), "non-positive stride is not supported");
    TORCH_CHECK(!any(dilation, [](int64_t x) { return x <= 0; }), "dilation should be greater than zero, but got ",
                c10::IntArrayRef(dilation));
  }
  if (weight.dim() < 2 || input.dim() != weight.dim() || groups <= 0) return;  // the meta function's errors
  TORCH_CHECK(weight.size(0) >= groups, "Given groups=", groups, ", expected weight to be at least ", groups,
              " at dimension 0, but got weight of size ", weight.sizes(), " instead");
  bool empty_spatial = false, empty_kernel = false;
  for (int64_t d = 2; d < input.dim(); ++d) {
    empty_spatial = empty_spatial || input.size(d) == 0;
    empty_kernel = empty_kernel || weight.size(d) == 0;
  }
  TORCH_CHECK(!empty_spatial || input.size(0) == 0 || input.size(1) == 0,
              "Only zero batch or zero channel inputs are supported, but got input shape: ", input.sizes());
  TORCH_CHECK(!empty_kernel, "kernel size should be greater than zero, but got kernel size ",
              weight.sizes().slice(2));
  TORCH_CHECK(!transposed || weight.numel() > 0, "non-empty ", weight.dim(), "D weight tensor expected, but got: ",
              weight.sizes());
  TORCH_CHECK(weight.size(0) % groups == 0, "Given groups=", groups, ", expected weight to be divisible by ", groups,
              " at dimension 0, but got weight of size [", weight.sizes(), "] instead");
  if (transposed)
    TORCH_CHECK(input.size(1) == weight.size(0), "Given transposed=1, weight of size ", weight.sizes(),
                ", expected input", input.sizes(), " to have ", weight.size(0), " channels, but got ", input.size(1),
                " channels instead");
  if (args[2].isTensor() && args[2].toTensor().defined()) {
    const at::Tensor& bias = args[2].toTensor();
    int64_t out = transposed ? weight.size(1) * groups : weight.size(0);
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == out, "Given ", transposed ? "transposed=1, " : "",
                "weight of size ", weight.sizes(), ", expected bias to be 1-dimensional with ", out,
                " elements, but got bias of size ", bias.sizes(), " instead");
  }
}
// bitwise_not(self): integers and bools only (stablehlo.not takes no floats).
void bitwise_not_dtype(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0})) return;
  c10::ScalarType t = dtype_at(args, 0);
  TORCH_CHECK_NOT_IMPLEMENTED(c10::isIntegralType(t, /*includeBool=*/true), "\"bitwise_not\" not implemented for '",
                              t, "'");
}
// heaviside(self, values): CPU's kernel takes one dtype.
void heaviside_dtypes(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 1})) return;
  TORCH_CHECK(dtype_at(args, 0) == dtype_at(args, 1),
              "heaviside is not yet implemented for tensors with different dtypes.");
}
// _softmax.out / _log_softmax.out(self, dim, half_to_float, out): out of the result's dtype.
void softmax_out_dtype(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 4 || !tensors_at(args, {0, 3})) return;
  c10::ScalarType want = args[2].toBool() ? c10::kFloat : dtype_at(args, 0);
  TORCH_CHECK(dtype_at(args, 3) == want, "Expected out tensor to have dtype ", c10::scalarTypeToTypeMeta(want).name(),
              ", but got ", c10::scalarTypeToTypeMeta(dtype_at(args, 3)).name(), " instead");
}
// cat / stack(tensors, dim, out): the inputs' common dtype must cast to out's (CPU's TypeError).
void cat_out_dtype(c10::ArrayRef<c10::IValue> args, const char* op) {
  if (args.size() < 3 || !args[0].isTensorList() || !args.back().isTensor()) return;
  std::vector<at::Tensor> ins = args[0].toTensorList().vec();
  if (ins.empty()) return;
  c10::ScalarType common = at::native::result_type(ins), out = args.back().toTensor().scalar_type();
  TORCH_CHECK_TYPE(c10::canCast(common, out), "torch.", op, "(): input types can't be cast to the desired output type ",
                   out);
}
void cat_checks(c10::ArrayRef<c10::IValue> args) { cat_out_dtype(args, "cat"); }
void stack_checks(c10::ArrayRef<c10::IValue> args) { cat_out_dtype(args, "cat"); }  // (CPU names cat)
void addmv_dtypes(c10::ArrayRef<c10::IValue> args) {  // addmv(self, mat, vec)
  if (!tensors_at(args, {0, 1, 2})) return;
  c10::ScalarType s = dtype_at(args, 0), m = dtype_at(args, 1), v = dtype_at(args, 2);
  TORCH_CHECK(s == m && m == v, "addmv input tensors must have the same dtype, but got ", s, ", ", m, ", and ", v);
}
// addmv(self, mat, vec, beta, alpha[, out]) and addmv_: CPU's meta function checks the
// ranks, the sizes (self has mat's rows or one element) and the dtypes, then set_output
// the result (vec's dtype).
template <bool in_place>
void addmv_checks(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 1, 2})) return;
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& mat = args[1].toTensor();
  const at::Tensor& vec = args[2].toTensor();
  TORCH_CHECK(mat.dim() == 2 && vec.dim() == 1 && self.dim() <= 1, "vector + matrix @ vector expected, got ",
              self.dim(), ", ", mat.dim(), ", ", vec.dim());
  TORCH_CHECK(mat.size(1) == vec.size(0) && (mat.size(0) == self.numel() || self.numel() == 1),
              "size mismatch, got input (", self.size(0), "), mat (", mat.size(0), "x", mat.size(1), "), vec (",
              vec.size(0), ")");
  addmv_dtypes(args);
  if (in_place) {
    check_inplace(self, {mat.size(0)}, vec.scalar_type());
  } else if (const at::Tensor* out = out_arg(args, 5)) {
    check_out_dtype(*out, vec.scalar_type());
  }
}
void mv_dtypes(c10::ArrayRef<c10::IValue> args) {  // mv(self, vec): the result takes vec's dtype
  if (!tensors_at(args, {0, 1})) return;
  c10::ScalarType m = dtype_at(args, 0), v = dtype_at(args, 1);
  TORCH_CHECK(m == v, "addmv input tensors must have the same dtype, but got ", v, ", ", m, ", and ", v);
}
void dot_dtypes(c10::ArrayRef<c10::IValue> args) {  // dot / vdot(self, other)
  if (!tensors_at(args, {0, 1})) return;
  TORCH_CHECK(dtype_at(args, 0) == dtype_at(args, 1), "dot : expected both vectors to have same dtype, but found ",
              dtype_at(args, 0), " and ", dtype_at(args, 1));
}

// mean's out= forms: CPU divides the sum in place in `out`, whose integral (or bool)
// dtype refuses the division's floating result.
void mean_out_dtype(c10::ArrayRef<c10::IValue> args) {
  if (args.empty() || !args.back().isTensor()) return;  // the functional forms
  c10::ScalarType out = args.back().toTensor().scalar_type();
  TORCH_CHECK(!c10::isIntegralType(out, /*includeBool=*/true), "result type ",
              c10::typeMetaToScalarType(c10::get_default_dtype()), " can't be cast to the desired output type ", out);
}

// argmax/argmin of bool: CPU's kernels refuse it (CUDA's have no bool kernel either).
void no_bool_input(c10::ArrayRef<c10::IValue> args, const char* op) {
  TORCH_CHECK(args.empty() || !args[0].isTensor() || args[0].toTensor().scalar_type() != c10::kBool, op,
              "(): does not support bool input");
}
void argmax_input(c10::ArrayRef<c10::IValue> args) { no_bool_input(args, "argmax"); }
void argmin_input(c10::ArrayRef<c10::IValue> args) { no_bool_input(args, "argmin"); }

// bernoulli(p) and bernoulli_(p): CPU's kernel takes floating probabilities only and
// expands p to self's shape.
void bernoulli_p(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || args[1].isDouble()) return;  // bernoulli.p, bernoulli_.float
  bool own = !args[1].isTensor();  // bernoulli(self, generator) and its out=: self holds them
  const at::Tensor& p = own ? args[0].toTensor() : args[1].toTensor();
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(p.scalar_type()), "\"bernoulli_tensor_cpu_p_\" not implemented for '",
                              p.scalar_type(), "'");
  if (!own) (void)p.expand(args[0].toTensor().sizes());
}

// _int_mm(a, b, out): the int32 result is written as is (CPU and CUDA refuse another out).
void int_mm_out_dtype(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 3 || !args[2].isTensor()) return;
  c10::ScalarType t = args[2].toTensor().scalar_type();
  TORCH_CHECK(t == at::kInt, "_int_mm: Expected result dtype to be of type kInt but got ",
              c10::scalarTypeToTypeMeta(t).name());
}

// Linear algebra out= forms write their results exactly (CPU's structured kernels refuse
// an out of another floating dtype; ours would cast into it). `inputs`: arguments before
// the outs; a floating out holds the input's dtype, or its real one (eigenvalues).
template <size_t inputs>
void linalg_out_dtypes(c10::ArrayRef<c10::IValue> args) {
  if (args.size() <= inputs || !args[0].isTensor()) return;
  c10::ScalarType t = args[0].toTensor().scalar_type();
  for (size_t i = inputs; i < args.size(); ++i) {
    if (!args[i].isTensor()) continue;
    c10::ScalarType o = args[i].toTensor().scalar_type();
    if (!c10::isFloatingType(o) && !c10::isComplexType(o)) continue;
    c10::ScalarType want = c10::isComplexType(o) ? t : c10::toRealValueType(t);
    TORCH_CHECK(o == want || o == t, "Expected out tensor to have dtype ", c10::scalarTypeToTypeMeta(want).name(),
                ", but got ", c10::scalarTypeToTypeMeta(o).name(), " instead");
  }
}

// native_dropout(x, p, train): training draws a bernoulli mask, which CUDA's kernel and
// CPU's F.dropout refuse for complex values (not training is the identity). F.dropout
// reaches this op on tpu as on CUDA; CPU's own native_dropout would accept complex.
void dropout_complex(c10::ArrayRef<c10::IValue> args) {
  c10::ScalarType t = args[0].toTensor().scalar_type();
  bool train = args.size() < 3 || args[2].isNone() || args[2].toBool();
  TORCH_CHECK_NOT_IMPLEMENTED(!train || !c10::isComplexType(t), "native_dropout: not implemented for '", t,
                              "' (CPU's bernoulli mask refuses complex values too)");
}

// randperm(n, generator, out): out's dtype must hold 0..n-1 exactly.
void randperm_size(c10::ArrayRef<c10::IValue> args) {
  int64_t n = args[0].toInt();
  c10::ScalarType t = args.back().toTensor().scalar_type();
  TORCH_CHECK_NOT_IMPLEMENTED(t != c10::kBool, "\"randperm\" not implemented for '", t, "'");
  if (t == c10::kHalf) TORCH_CHECK(n <= 2049, "n cannot be greater than 2049 for Half type.");
  if (t == c10::kFloat) TORCH_CHECK(n <= (int64_t{1} << 24) + 1, "n cannot be greater than 2^24+1 for Float type.");
  if (t == c10::kDouble) TORCH_CHECK(n <= (int64_t{1} << 53) + 1, "n cannot be greater than 2^53+1 for Double type.");
  static const std::unordered_map<int, const char*> names = {
      {static_cast<int>(c10::kByte), "uint8_t"}, {static_cast<int>(c10::kChar), "int8_t"},
      {static_cast<int>(c10::kShort), "int16_t"}, {static_cast<int>(c10::kInt), "int32_t"}};
  auto it = names.find(static_cast<int>(t));
  if (it != names.end() && n > 0)
    TORCH_CHECK(n - 1 <= integral_range(t).second, "value cannot be converted to type ", it->second,
                " without overflow");
}

// A value written into a tensor of dtype `t` as CPU's fill-like kernels convert it
// (Scalar::to<scalar_t>, which raises "value cannot be converted to type ... without
// overflow", also for a complex value with an imaginary part into a real type). Every
// dtype is checked here, on the host: the barebones unsigned and float8 types too (a
// device-side check is not reported at the call in DeferAndFuse).
void check_fits(const c10::Scalar& v, c10::ScalarType t) {
  if (t == c10::kComplexHalf) return;  // CPU's fill takes any value; the dtype is refused later
  switch (t) {
#define TPU_CHECK_FITS(T, name)  \
  case c10::ScalarType::name:    \
    (void)v.to<T>();             \
    return;
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX(TPU_CHECK_FITS)
    TPU_CHECK_FITS(uint16_t, UInt16)
    TPU_CHECK_FITS(uint32_t, UInt32)
    TPU_CHECK_FITS(uint64_t, UInt64)
#undef TPU_CHECK_FITS
    default:
      return;
  }
}

// fill_(self, value), masked_fill(self, mask, value), index_fill(self, dim, index, value),
// scatter(self, dim, index, value[, reduce]): the Scalar `value` into self's dtype
// (full, full_like and new_full fill through fill_).
template <int kValue>
void fill_value(c10::ArrayRef<c10::IValue> args) {
  if (static_cast<int>(args.size()) <= kValue || !args[0].isTensor() || !is_scalar(args[kValue])) return;
  const at::Tensor& self = args[0].toTensor();
  c10::ScalarType t = self.scalar_type();
  // CPU fills a one-element tensor of a half or float8 type (scalar_tensor: a Python
  // number meeting such a tensor in where) unchecked: a value past its range converts as
  // .to() converts it (inf, or float8's saturation or NaN).
  if (kValue == 1 && self.numel() == 1 && (t == c10::kHalf || t == c10::kBFloat16 || c10::isFloat8Type(t))) return;
  check_fits(args[kValue].toScalar(), t);
}

// clamp(self, min?, max?) with Scalars: each bound into self's dtype, where it stays
// self's (an integer tensor clamped by a float bound computes in float).
void clamp_bounds(c10::ArrayRef<c10::IValue> args) {
  if (args.empty() || !args[0].isTensor()) return;
  c10::ScalarType t = args[0].toTensor().scalar_type();
  for (size_t i = 1; i < args.size() && i < 3; ++i) {
    if (!is_scalar(args[i])) continue;
    c10::Scalar v = args[i].toScalar();
    if (c10::isIntegralType(t, /*includeBool=*/true) && (v.isFloatingPoint() || v.isComplex())) continue;
    if (v.isComplex() && c10::isFloatingType(t)) check_fits(v, c10::kDouble);  // CPU's first conversion
    check_fits(v, t);
  }
}

// where(condition, self, other) where a Python number (a wrapped 0-d tensor) meets an
// integer tensor: CPU converts the number into the integer type, checked.
void where_number(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 3 || !args[1].isTensor() || !args[2].isTensor()) return;
  const at::Tensor& a = args[1].toTensor();
  const at::Tensor& b = args[2].toTensor();
  auto wrapped = [](const at::Tensor& x) { return x.unsafeGetTensorImpl()->is_wrapped_number(); };
  for (auto [num, other] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
    if (!wrapped(*num) || wrapped(*other) || !c10::isIntegralType(other->scalar_type(), /*includeBool=*/false) ||
        !c10::isIntegralType(num->scalar_type(), /*includeBool=*/false))
      continue;
    check_fits(num->item(), other->scalar_type());
  }
}

// sub / rsub (self, other, alpha): CPU refuses bool operands (the error names what to
// use instead); a Python bool is a bool operand too.
void sub_bool(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2) return;
  auto is_bool = [](const c10::IValue& v) {
    return v.isTensor() ? v.toTensor().scalar_type() == c10::kBool : is_scalar(v) && v.toScalar().isBoolean();
  };
  bool a = is_bool(args[0]), b = is_bool(args[1]);
  TORCH_CHECK(!(a && b), "Subtraction, the `-` operator, with two bool tensors is not supported. "
                         "Use the `^` or `logical_xor()` operator instead.");
  TORCH_CHECK(!a && !b, "Subtraction, the `-` operator, with a bool tensor is not supported. "
                        "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.");
}

// add / sub / rsub (self, other, alpha): CPU's check of alpha against the operands'
// common dtype (a bool or float alpha would otherwise be cast into an integer result).
void alpha_value(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 3 || !args[0].isTensor() || !is_scalar(args[2])) return;
  // An integer alpha (the default 1) passes whatever the common dtype: not computed.
  if (args[2].isInt()) return;
  const at::Tensor& self = args[0].toTensor();
  c10::ScalarType t = args[1].isTensor()   ? at::result_type(self, args[1].toTensor())
                      : is_scalar(args[1]) ? at::result_type(self, args[1].toScalar())
                                           : self.scalar_type();
  c10::Scalar alpha = args[2].toScalar();
  TORCH_CHECK(!alpha.isBoolean() || t == c10::kBool, "Boolean alpha only supported for Boolean results.");
  TORCH_CHECK(c10::isFloatingType(t) || c10::isComplexType(t) || alpha.isIntegral(/*includeBool=*/true),
              "For integral input tensors, argument alpha must not be a floating point number.");
  TORCH_CHECK(c10::isComplexType(t) || !alpha.isComplex(),
              "For non-complex input tensors, argument alpha must not be a complex number.");
}

// addcmul(self, tensor1, tensor2, value): CPU's kernel converts value into the
// operands' common dtype, checked.
void addc_value(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 4 || !tensors_at(args, {0, 1, 2}) || !is_scalar(args[3])) return;
  at::native::ResultTypeState state = {};
  for (size_t i : {0, 1, 2}) state = at::native::update_result_type_state(args[i].toTensor(), state);
  check_fits(args[3].toScalar(), at::native::result_type(state));
}

// sub / rsub: CPU refuses bool operands before it looks at alpha.
void sub_alpha(c10::ArrayRef<c10::IValue> args) {
  sub_bool(args);
  alpha_value(args);
}

}  // namespace

KernelCheck value_check_for(const std::string& base) {
  static const std::unordered_map<std::string, KernelCheck> checks = {
      {"pow", &pow_exponent},
      {"_foreach_pow", &foreach_pow_exponent},
      {"softshrink", &softshrink_lambda},
      {"celu", &celu_alpha},
      {"linalg_vector_norm", &norm_order},
      {"norm", &norm_order},
      {"fill", &fill_value<1>},
      {"masked_fill", &fill_value<2>},
      {"index_fill", &fill_value<3>},
      {"scatter", &fill_value<3>},
      {"clamp", &clamp_bounds},
      {"clamp_min", &clamp_bounds},
      {"clamp_max", &clamp_bounds},
      {"where", &where_number},
      {"add", &alpha_value},
      {"sub", &sub_alpha},
      {"rsub", &sub_alpha},
      {"addcmul", &addc_value},
  };
  auto it = checks.find(base);
  return it == checks.end() ? random_value_check_for(base) : it->second;
}

// The index of index_select / index_add / index_copy / index_fill / index_reduce
// (self, dim, index, ...): CPU's kernels check its dtype (a float index would otherwise be
// read as integers).
c10::ScalarType index_dtype(c10::ArrayRef<c10::IValue> args) {
  return args.size() > 2 && args[2].isTensor() ? args[2].toTensor().scalar_type() : c10::kLong;
}
bool int_index(c10::ScalarType t) { return t == c10::kLong || t == c10::kInt; }
void index_select_index(c10::ArrayRef<c10::IValue> args) {
  TORCH_CHECK(int_index(index_dtype(args)), "index_select(): Expected dtype int32 or int64 for index");
  TORCH_CHECK_INDEX(args.size() < 3 || !args[2].isTensor() || args[2].toTensor().dim() <= 1,
                    "index_select(): Index is supposed to be a vector");
}
void index_add_index(c10::ArrayRef<c10::IValue> args) {
  TORCH_CHECK(int_index(index_dtype(args)), "index_add_(): Expected dtype int32/int64 for index but got: ",
              index_dtype(args));
}
// index_add(self, dim, index, source[, alpha]): CPU's and CUDA's kernels take one dtype
// (a cast would hide a mix-up the user meant to see).
void index_add_checks(c10::ArrayRef<c10::IValue> args) {
  index_add_index(args);
  if (!tensors_at(args, {0, 3})) return;
  TORCH_CHECK(dtype_at(args, 0) == dtype_at(args, 3), "index_add_(): self (", dtype_at(args, 0), ") and source (",
              dtype_at(args, 3), ") must have the same scalar type");
}
// index_reduce(self, dim, index, source, reduce, ...): CPU's meta function (PyTorch's
// Python one, which tpu's planning runs, checks nothing), in its order.
void index_reduce_checks(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 2, 3}) || !args[1].isInt()) return;
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& index = args[2].toTensor();
  const at::Tensor& source = args[3].toTensor();
  int64_t dim = at::maybe_wrap_dim(args[1].toInt(), self.dim());
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_reduce_(): Index is supposed to be a vector, but got dim: ",
                    index.dim(), " with type: ", index.scalar_type(), " and size: ", index.sizes());
  TORCH_CHECK(int_index(index.scalar_type()), "index_reduce_(): Expected dtype int32/int64 for index but got: ",
              index.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "index_reduce_(): self (", self.scalar_type(),
              ") and source (", source.scalar_type(), ") must have the same scalar type");
  TORCH_CHECK(dim == 0 || dim < source.dim(), "index_reduce_(): Indexing dim ", dim,
              " is out of bounds of the source tensor with dim ", source.dim());
  int64_t slices = source.dim() == 0 ? 1 : source.size(dim);
  TORCH_CHECK(index.numel() == slices, "index_reduce_(): Number of indices (", index.numel(),
              ") should be equal to source.size(dim): (", slices, "), for dim: ", dim);
  std::vector<int64_t> self_sizes = self.sizes().vec(), source_sizes = source.sizes().vec();
  if (source.dim() != 0 && self.dim() != 0) {
    self_sizes.erase(self_sizes.begin() + dim);
    source_sizes.erase(source_sizes.begin() + dim);
  }
  TORCH_CHECK(self_sizes == source_sizes,
              "source tensor shape must match self tensor shape, excluding the specified dimension. Got self.shape = ",
              self.sizes(), " source.shape = ", source.sizes());
}
void index_copy_index(c10::ArrayRef<c10::IValue> args) {
  TORCH_CHECK(index_dtype(args) == c10::kLong, "index_copy_(): Expected a long tensor for index, but got ",
              index_dtype(args));
}
void index_copy_checks(c10::ArrayRef<c10::IValue> args) {
  index_copy_index(args);
  if (!tensors_at(args, {0, 3})) return;
  TORCH_CHECK(dtype_at(args, 0) == dtype_at(args, 3),
              "index_copy_(): self and source expected to have the same dtype, but got (self) ", dtype_at(args, 0),
              " and (source) ", dtype_at(args, 3));
}
// put(self, index, source, accumulate): CPU's kernel takes an int64 index (a float one
// would otherwise be truncated) and one source element per index.
void put_checks(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 1, 2})) return;
  TORCH_CHECK(dtype_at(args, 1) == c10::kLong, "put_(): Expected a long tensor for index, but got ",
              dtype_at(args, 1));
  TORCH_CHECK(dtype_at(args, 0) == dtype_at(args, 2),
              "put_(): self and source expected to have the same dtype, but got self.dtype = ", dtype_at(args, 0),
              " and source.dtype = ", dtype_at(args, 2));
  int64_t sources = args[2].toTensor().numel(), indices = args[1].toTensor().numel();
  TORCH_CHECK_INDEX(sources == indices,
                    "put_(): Expected source and index to have the same number of elements, but got source.numel() = ",
                    sources, ", index.numel() = ", indices);
  TORCH_CHECK_INDEX(!(args[0].toTensor().numel() == 0 && indices != 0),
                    "put_(): Tried to put elements into an empty tensor");
}
// slice_scatter(self, src, dim, start, end, step) / select_scatter(self, src, dim,
// index): src must have the shape of the slice it replaces (CPU's functional kernels;
// PyTorch's meta functions check nothing). The slice is taken of a meta tensor of self's
// shape, for ATen's own rules (and errors) of slicing.
void scattered_slice_shape(const at::Tensor& src, const at::Tensor& slice) {
  TORCH_CHECK(slice.sizes() == src.sizes(), "expected src to have a size equal to the slice of self. src size = ",
              src.sizes(), ", slice size = ", slice.sizes());
}
at::Tensor meta_like(const at::Tensor& t) {
  return at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).device(at::kMeta));
}
void slice_scatter_src(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 1})) return;
  int64_t dim = args.size() > 2 && args[2].isInt() ? args[2].toInt() : 0;
  auto opt = [&](size_t i) { return args.size() > i && args[i].isInt() ? std::optional<int64_t>(args[i].toInt()) : std::nullopt; };
  int64_t step = args.size() > 5 && args[5].isInt() ? args[5].toInt() : 1;
  scattered_slice_shape(args[1].toTensor(), meta_like(args[0].toTensor()).slice(dim, opt(3), opt(4), step));
}
void select_scatter_src(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 1}) || args.size() < 4 || !args[2].isInt() || !args[3].isInt()) return;
  scattered_slice_shape(args[1].toTensor(), meta_like(args[0].toTensor()).select(args[2].toInt(), args[3].toInt()));
}
// masked_fill(self, mask, value), in place or not: CPU's kernel takes a bool mask only
// (PyTorch's meta function for masked_fill_.Scalar does not check).
void masked_fill_mask(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 1})) return;
  c10::ScalarType m = dtype_at(args, 1);
  TORCH_CHECK(m == c10::kBool, "masked_fill_ only supports boolean masks, but got mask with dtype ",
              c10::scalarTypeToTypeMeta(m).name());
}
// binary_cross_entropy(self, target, weight, reduction): CPU's TensorIterator takes the
// target in the input's dtype (the weight multiplies afterwards, in any dtype). Also
// binomial(count, prob) and _standard_gamma_grad(self, output): the second in the first's.
void bce_dtypes(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 1})) return;
  TORCH_CHECK(dtype_at(args, 0) == dtype_at(args, 1), "Found dtype ", dtype_at(args, 1), " but expected ",
              dtype_at(args, 0));
}
// _dirichlet_grad(x, alpha, total): CPU's TensorIterator takes all three in x's dtype.
void dirichlet_grad_dtypes(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 1, 2})) return;
  for (size_t i : {1, 2})
    TORCH_CHECK(dtype_at(args, 0) == dtype_at(args, i), "Found dtype ", dtype_at(args, i), " but expected ",
                dtype_at(args, 0));
}
// _cdist_forward(x1, x2, p, compute_mode)
void cdist_dtypes(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 1})) return;
  TORCH_CHECK(dtype_at(args, 0) == dtype_at(args, 1), "expected scalar type ", dtype_at(args, 0), " but found ",
              dtype_at(args, 1));
}
void index_fill_index(c10::ArrayRef<c10::IValue> args) {
  TORCH_CHECK_INDEX(index_dtype(args) == c10::kLong, "index_fill_(): Expected dtype int64 for index.");
}
// _scaled_mm(self, mat2, scale_a, scale_b, ...): CPU's (and CUDA's) ValueError for the
// scalings the lowering does not take: fp8 operands with float32 scales, tensorwise (one
// element each) or row-wise (scale_a [M,1], scale_b [1,N]). (tpu also takes non-contiguous
// row-wise scales, so the message leaves out CPU's contiguity rule.)
void scaled_mm_scales(c10::ArrayRef<c10::IValue> args) {
  if (!tensors_at(args, {0, 1, 2, 3})) return;
  const at::Tensor& a = args[0].toTensor();
  const at::Tensor& b = args[1].toTensor();
  const at::Tensor& sa = args[2].toTensor();
  const at::Tensor& sb = args[3].toTensor();
  if (a.dim() != 2 || b.dim() != 2) return;  // the meta kernel's error
  int64_t m = a.size(0), n = b.size(1);
  bool fp8 = c10::isFloat8Type(a.scalar_type()) && c10::isFloat8Type(b.scalar_type());
  bool f32 = sa.scalar_type() == c10::kFloat && sb.scalar_type() == c10::kFloat;
  bool tensorwise = sa.numel() == 1 && sb.numel() == 1;
  bool rowwise = sa.sizes() == c10::IntArrayRef{m, 1} && sb.sizes() == c10::IntArrayRef{1, n};
  TORCH_CHECK_VALUE(fp8 && f32 && (tensorwise || rowwise), "Invalid scaling configuration.\n",
                    "- For TensorWise scaling, a and b should be float8, scales should be float and singletons.\n",
                    "- For RowWise scaling, a and b should be float8, scales should be float, scale_a should be (", m,
                    ", 1) and scale_b should be (1, ", n, ").\nGot mat_a.dtype()=", a.scalar_type(),
                    ", scale_a.dtype()=", sa.scalar_type(), ", scale_a.size()=", sa.sizes(), ", scale_a.stride()=",
                    sa.strides(), ", mat_b.dtype()=", b.scalar_type(), ", scale_b.dtype()=", sb.scalar_type(),
                    ", scale_b.size()=", sb.sizes(), " and scale_b.stride()=", sb.strides());
}
// var / std (every overload): CPU's and CUDA's kernels take floating and complex only.
// float8 is floating, but CPU's kernels have none for it: a reduction over every dim
// raises from std_var_all (a RuntimeError), others from the dtype dispatch.
void var_std_dtype(c10::ArrayRef<c10::IValue> args) {
  if (args.empty() || !args[0].isTensor()) return;
  const at::Tensor& self = args[0].toTensor();
  c10::ScalarType t = self.scalar_type();
  TORCH_CHECK(c10::isFloatingType(t) || c10::isComplexType(t),
              "std and var only support floating point and complex dtypes");
  if (!c10::isFloat8Type(t)) return;
  bool all = args.size() < 2 || args[1].isNone();
  if (!all && args[1].isIntList()) {
    std::vector<int64_t> dims = args[1].toIntVector();
    all = dims.empty() || static_cast<int64_t>(std::set<int64_t>(dims.begin(), dims.end()).size()) >= self.dim();
  }
  TORCH_CHECK(!all, "std_var_all: Unsupported dtype ", t);
}
// mul with float8 and a one-element other (a Scalar, or a tensor of one element):
// CPU's kernel takes the reduced-float path for a scalar other, which has no float8.
void mul_float8_scalar(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[0].isTensor()) return;
  const at::Tensor& self = args[0].toTensor();
  if (!c10::isFloat8Type(self.scalar_type())) return;
  c10::ScalarType common;
  if (args[1].isTensor()) {
    const at::Tensor& other = args[1].toTensor();
    if (other.numel() != 1) return;
    common = at::result_type(self, other);  // CPU's promotion error where mixed
  } else if (args[1].isScalar()) {
    common = at::result_type(self, args[1].toScalar());
  } else {
    return;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(!c10::isFloat8Type(common), "\"mul_cpu_reduced_float\" not implemented for '", common,
                              "'");
}
// multinomial(self, num_samples, replacement, generator): a shape check CPU makes.
void multinomial_samples(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 3 || !args[0].isTensor() || args[2].toBool()) return;
  const at::Tensor& p = args[0].toTensor();
  TORCH_CHECK(p.dim() == 0 || args[1].toInt() <= p.size(-1),
              "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
}

// upsample_{linear1d,bilinear2d,bicubic2d,trilinear3d}(self, output_size, align_corners,
// ...): CPU's kernels refuse an empty spatial input or output (the meta functions pass
// them, and ours would return zeros), then an empty non-batch dimension.
template <int64_t Rank>
void upsample_sizes(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[0].isTensor() || !args[1].isIntList()) return;
  const at::Tensor& self = args[0].toTensor();
  std::vector<int64_t> out = args[1].toIntVector();
  if (self.dim() != Rank + 2 || static_cast<int64_t>(out.size()) != Rank) return;  // the meta function's error
  static const char* names[] = {"D", "H", "W"};
  bool positive = true;
  std::string in_str, out_str;
  for (int64_t i = 0; i < Rank; ++i) {
    int64_t in_i = self.size(2 + i);
    positive = positive && in_i > 0 && out[i] > 0;
    const char* sep = i ? ", " : "";
    in_str += sep + std::string(names[3 - Rank + i]) + ": " + std::to_string(in_i);
    out_str += sep + std::string(names[3 - Rank + i]) + ": " + std::to_string(out[i]);
  }
  TORCH_CHECK(positive, "Input and output sizes should be greater than 0, but got input (", in_str, ")",
              Rank == 1 ? " and output (" : " output (", out_str, ")");
  TORCH_CHECK(self.numel() != 0 || c10::multiply_integers(self.sizes().begin() + 1, self.sizes().end()) != 0,
              "Non-empty ", Rank + 2, "D data tensor expected but got a tensor with sizes ", self.sizes());
}

// grid_sampler_2d(input, grid, ...): CPU's kernel refuses an empty spatial dimension (the
// 3-d meta function checks it, the 2-d one does not).
void grid_sampler_2d_input(c10::ArrayRef<c10::IValue> args) {
  if (args.empty() || !args[0].isTensor()) return;
  const at::Tensor& input = args[0].toTensor();
  for (int64_t i = 2; i < input.dim(); ++i)
    TORCH_CHECK(input.size(i) > 0, "grid_sampler(): expected input to have non-empty spatial dimensions, ",
                "but input has sizes ", input.sizes(), " with dimension ", i, " being empty");
}

KernelCheck kernel_check_for(const std::string& base) {
  static const std::unordered_map<std::string, KernelCheck> checks = {
      {"index", &index_checks},
      {"index_put", &index_put_checks},
      {"_index_put_impl", &index_put_checks},
      {"_unsafe_index_put", &index_put_checks},
      {"nll_loss_forward", &nll_target_dtype},
      {"mm", &mm_dtypes},
      {"bmm", &bmm_dtypes},
      {"baddbmm", &baddbmm_checks<false>},
      {"baddbmm_", &baddbmm_checks<true>},
      {"addmm", &addmm_checks<false>},
      {"addmm_", &addmm_checks<true>},
      {"convolution", &convolution_checks},
      {"convolution_overrideable", &convolution_checks},
      {"bitwise_not", &bitwise_not_dtype},
      {"heaviside", &heaviside_dtypes},
      {"_softmax", &softmax_out_dtype},
      {"_log_softmax", &softmax_out_dtype},
      {"cat", &cat_checks},
      {"stack", &stack_checks},
      {"addbmm", &addbmm_checks},
      {"addmv", &addmv_checks<false>},
      {"addmv_", &addmv_checks<true>},
      {"mv", &mv_dtypes},
      {"dot", &dot_dtypes},
      {"vdot", &dot_dtypes},
      {"nll_loss2d_forward", &nll2d_target_dtype},
      {"mean", &mean_out_dtype},
      {"bernoulli", &bernoulli_p},
      {"randperm", &randperm_size},
      {"native_dropout", &dropout_complex},
      {"_int_mm", &int_mm_out_dtype},
      {"_linalg_eigh", &linalg_out_dtypes<3>},       // (A, UPLO, compute_v | eigenvalues, eigenvectors)
      {"linalg_qr", &linalg_out_dtypes<2>},          // (A, mode | Q, R)
      {"linalg_lu_factor_ex", &linalg_out_dtypes<3>},  // (A, pivot, check_errors | LU, pivots, info)
      {"argmax", &argmax_input},
      {"argmin", &argmin_input},
      {"index_select", &index_select_index},
      {"index_add", &index_add_checks},
      {"put", &put_checks},
      {"binary_cross_entropy", &bce_dtypes},
      {"binomial", &bce_dtypes},
      {"_standard_gamma_grad", &bce_dtypes},
      {"_dirichlet_grad", &dirichlet_grad_dtypes},
      {"_cdist_forward", &cdist_dtypes},
      {"index_reduce", &index_reduce_checks},
      {"slice_scatter", &slice_scatter_src},
      {"select_scatter", &select_scatter_src},
      {"masked_fill", &masked_fill_mask},
      {"index_copy", &index_copy_checks},
      {"index_fill", &index_fill_index},
      {"multinomial", &multinomial_samples},
      {"mul", &mul_float8_scalar},
      {"var", &var_std_dtype},
      {"std", &var_std_dtype},
      {"sub", &sub_bool},
      {"rsub", &sub_bool},
      {"_scaled_mm", &scaled_mm_scales},
      {"upsample_linear1d", &upsample_sizes<1>},
      {"upsample_bilinear2d", &upsample_sizes<2>},
      {"upsample_bicubic2d", &upsample_sizes<2>},
      {"upsample_trilinear3d", &upsample_sizes<3>},
      {"grid_sampler_2d", &grid_sampler_2d_input},
  };
  auto it = checks.find(base);
  return it == checks.end() ? bool_result_dtype_check_for(base) : it->second;
}

ComplexRefusal complex_refusal_for(const std::string& name, const std::string& base) {
  using R = ComplexRefusal;
  // Overloads that differ from their base's kind first.
  static const std::unordered_map<std::string, R> by_name = {
      {"max.dim", R::Runtime}, {"min.dim", R::Runtime}, {"max.dim_max", R::Runtime}, {"min.dim_min", R::Runtime},
  };
  static const std::unordered_map<std::string, R> by_base = {
      // comparisons and bit operations
      {"lt", R::NotImplemented}, {"le", R::NotImplemented}, {"gt", R::NotImplemented}, {"ge", R::NotImplemented},
      {"signbit", R::NotImplemented}, {"bitwise_not", R::NotImplemented}, {"bitwise_and", R::NotImplemented},
      {"bitwise_or", R::NotImplemented}, {"bitwise_xor", R::NotImplemented},
      // orderings and selections
      {"max", R::NotImplemented}, {"min", R::NotImplemented}, {"amax", R::NotImplemented},
      {"amin", R::NotImplemented}, {"aminmax", R::NotImplemented}, {"argmax", R::Runtime}, {"argmin", R::Runtime},
      {"median", R::NotImplemented}, {"nanmedian", R::NotImplemented}, {"mode", R::NotImplemented},
      {"kthvalue", R::NotImplemented}, {"cummax", R::NotImplemented}, {"cummin", R::NotImplemented},
      {"sort", R::Runtime}, {"topk", R::Runtime}, {"_unique2", R::NotImplemented}, {"unique_dim", R::NotImplemented},
      {"unique_consecutive", R::NotImplemented}, {"histc", R::NotImplemented}, {"bincount", R::NotImplemented},
      {"bucketize", R::NotImplemented}, {"searchsorted", R::NotImplemented}, {"nansum", R::Runtime},
      // nn
      {"_softmax", R::NotImplemented}, {"_log_softmax", R::NotImplemented}, {"mse_loss", R::NotImplemented},
      {"smooth_l1_loss", R::NotImplemented}, {"huber_loss", R::NotImplemented},
      {"binary_cross_entropy", R::NotImplemented}, {"nll_loss_forward", R::NotImplemented},
      {"nll_loss2d_forward", R::NotImplemented}, {"avg_pool2d", R::NotImplemented}, {"avg_pool3d", R::NotImplemented},
      {"max_pool2d_with_indices", R::NotImplemented}, {"max_pool3d_with_indices", R::NotImplemented},
      {"_adaptive_avg_pool2d", R::NotImplemented}, {"_adaptive_avg_pool3d", R::NotImplemented},
      {"adaptive_max_pool2d", R::NotImplemented}, {"adaptive_max_pool3d", R::NotImplemented},
      {"upsample_nearest1d", R::NotImplemented}, {"upsample_nearest2d", R::NotImplemented},
      {"upsample_nearest3d", R::NotImplemented}, {"_upsample_nearest_exact1d", R::NotImplemented},
      {"_upsample_nearest_exact2d", R::NotImplemented}, {"_upsample_nearest_exact3d", R::NotImplemented},
      {"upsample_linear1d", R::NotImplemented},
      {"upsample_bilinear2d", R::NotImplemented}, {"upsample_bicubic2d", R::NotImplemented},
      {"upsample_trilinear3d", R::NotImplemented}, {"native_group_norm", R::NotImplemented},
      {"native_batch_norm", R::NotImplemented}, {"_native_batch_norm_legit", R::NotImplemented},
      {"_native_batch_norm_legit_no_training", R::NotImplemented},
      // factories and random
      {"arange", R::NotImplemented}, {"bernoulli", R::NotImplemented},
  };
  auto it = by_name.find(name);
  if (it != by_name.end()) return it->second;
  auto jt = by_base.find(base);
  return jt == by_base.end() ? R::None : jt->second;
}

ComplexRefusal integral_refusal_for(const std::string& name, const std::string& base, c10::ScalarType dtype) {
  using R = ComplexRefusal;
  // Which dtypes CPU's kernel leaves out: bool only, bool and every integer dtype, or all
  // but uint8 (nearest upsampling) or int64 (average pooling).
  enum Set { BoolOnly, Ints, IntsButByte, IntsButLong };
  struct Refusal {
    Set set;
    R kind;
  };
  static const std::unordered_map<std::string, Refusal> by_name = {
      {"round.decimals", {Ints, R::NotImplemented}}, {"round.decimals_out", {Ints, R::NotImplemented}},
      // with rounding_mode trunc/floor (a None mode gives a float result, not refused)
      {"div.Tensor_mode", {BoolOnly, R::NotImplemented}}, {"div.Scalar_mode", {BoolOnly, R::NotImplemented}},
      {"div.out_mode", {BoolOnly, R::NotImplemented}},
      {"clamp.Tensor", {BoolOnly, R::NotImplemented}}, {"clamp.Tensor_out", {BoolOnly, R::NotImplemented}},
      {"pow.Tensor_Tensor", {BoolOnly, R::NotImplemented}},
      {"pow.Tensor_Tensor_out", {BoolOnly, R::NotImplemented}},
  };
  static const std::unordered_map<std::string, Refusal> by_base = {
      {"topk", {BoolOnly, R::Runtime}}, {"kthvalue", {BoolOnly, R::NotImplemented}},
      {"median", {BoolOnly, R::NotImplemented}}, {"nanmedian", {BoolOnly, R::NotImplemented}},
      {"abs", {BoolOnly, R::NotImplemented}}, {"floor", {BoolOnly, R::NotImplemented}},
      {"ceil", {BoolOnly, R::NotImplemented}}, {"round", {BoolOnly, R::NotImplemented}},
      {"trunc", {BoolOnly, R::NotImplemented}}, {"frac", {Ints, R::NotImplemented}},
      {"remainder", {BoolOnly, R::NotImplemented}}, {"fmod", {BoolOnly, R::NotImplemented}},
      {"leaky_relu", {Ints, R::NotImplemented}}, {"hypot", {Ints, R::NotImplemented}},
      {"logaddexp", {Ints, R::NotImplemented}}, {"logaddexp2", {Ints, R::NotImplemented}},
      {"bucketize", {BoolOnly, R::NotImplemented}}, {"searchsorted", {BoolOnly, R::NotImplemented}},
      {"trace", {BoolOnly, R::NotImplemented}}, {"mse_loss", {Ints, R::NotImplemented}},
      {"avg_pool2d", {IntsButLong, R::NotImplemented}},
      {"upsample_nearest1d", {IntsButByte, R::NotImplemented}}, {"upsample_nearest2d", {IntsButByte, R::NotImplemented}},
      {"upsample_nearest3d", {IntsButByte, R::NotImplemented}},
      {"_upsample_nearest_exact1d", {IntsButByte, R::NotImplemented}},
      {"_upsample_nearest_exact2d", {IntsButByte, R::NotImplemented}},
      {"_upsample_nearest_exact3d", {IntsButByte, R::NotImplemented}},
      {"reflection_pad1d", {BoolOnly, R::NotImplemented}}, {"reflection_pad2d", {BoolOnly, R::NotImplemented}},
      {"reflection_pad3d", {BoolOnly, R::NotImplemented}}, {"replication_pad1d", {BoolOnly, R::NotImplemented}},
      {"replication_pad2d", {BoolOnly, R::NotImplemented}}, {"replication_pad3d", {BoolOnly, R::NotImplemented}},
      {"rsub", {BoolOnly, R::Runtime}}, {"threshold", {BoolOnly, R::NotImplemented}},
      {"dot", {BoolOnly, R::NotImplemented}}, {"mm", {BoolOnly, R::NotImplemented}},
      {"addmm", {BoolOnly, R::NotImplemented}}, {"bmm", {BoolOnly, R::NotImplemented}},
      {"baddbmm", {BoolOnly, R::NotImplemented}}, {"addbmm", {BoolOnly, R::NotImplemented}},
      {"mv", {BoolOnly, R::NotImplemented}}, {"addmv", {BoolOnly, R::NotImplemented}},
      {"addcmul", {BoolOnly, R::NotImplemented}}, {"max_pool2d_with_indices", {BoolOnly, R::NotImplemented}},
      {"max_pool3d_with_indices", {BoolOnly, R::NotImplemented}},
      {"convolution", {BoolOnly, R::NotImplemented}}, {"convolution_overrideable", {BoolOnly, R::NotImplemented}},
      {"_adaptive_avg_pool2d", {Ints, R::NotImplemented}}, {"_adaptive_avg_pool3d", {Ints, R::NotImplemented}},
      // (integer histc CPU refuses and CUDA bins: tpu follows CUDA, test_search_scan.py)
      {"histc", {BoolOnly, R::NotImplemented}}, {"addcdiv", {BoolOnly, R::Runtime}},
  };
  // float8 and uint16/32/64: CPU runs few kernels on them (dtype_support.h).
  if (is_limited_support_dtype(dtype))
    return limited_dtype_supported(base, dtype) || limited_dtype_supported(name, dtype) ? R::None
                                                                                          : R::NotImplemented;
  bool is_bool = dtype == c10::kBool;
  bool is_int = dtype == c10::kByte || dtype == c10::kChar || dtype == c10::kShort || dtype == c10::kInt ||
                dtype == c10::kLong;
  if (!is_bool && !is_int) return R::None;
  auto it = by_name.find(name);
  const Refusal* r = it != by_name.end() ? &it->second : nullptr;
  if (!r) {
    auto jt = by_base.find(base);
    if (jt == by_base.end()) return R::None;
    r = &jt->second;
  }
  bool refused = is_bool || (r->set == Ints) || (r->set == IntsButByte && dtype != c10::kByte) ||
                 (r->set == IntsButLong && dtype != c10::kLong);
  return refused ? r->kind : R::None;
}

}  // namespace tpu::backend
