// _foreach_* ops (what torch.optim uses with foreach=True). Each list position is
// lowered by the registered rule of the per-tensor op, through a Ctx that shows that
// rule element k of every list argument: one program for the whole list, no copy of
// the elementwise math.
#include <cmath>
#include <cstring>
#include <map>

#include "lowering/helpers.h"

namespace tpu::lowering {
namespace {

// How each argument of the foreach op maps onto the per-tensor op's argument:
//   L  Tensor[]  -> its element k        T  Tensor  -> itself (shared)
//   S  Scalar    -> itself               Z  Scalar[] -> its element k
//   V  Tensor of one scalar per element -> its element k, as a Scalar
//   1  (absent)  -> the Scalar 1 (alpha of add/sub)
//   x  any other argument (bool, int, ...) -> itself
class ElementCtx : public Ctx {
 public:
  struct Shared {  // per call: each list/scalar argument is fetched once
    std::map<int, std::vector<Value>> lists;
    std::map<std::pair<int, DType>, std::vector<Value>> scalars;
    std::map<std::pair<int, DType>, Value> shared_scalars;  // 'S': one operand for every element
  };

  ElementCtx(Ctx& f, const char* op, const char* kinds, int k, Shared& sh)
      : Ctx(f.b), f_(f), op_(op), kinds_(kinds), k_(k), sh_(sh) {}

  const std::string& op() const override { return op_; }
  int num_args() const override { return static_cast<int>(kinds_.size()); }
  bool is_none(int i) const override { return strchr("TSx", kind(i)) ? f_.is_none(i) : false; }
  bool is_tensor(int i) const override { return strchr("LT", kind(i)) || (kind(i) == 'x' && f_.is_tensor(i)); }

  Value in(int i) override { return kind(i) == 'L' ? list_of(i)[k_] : f_.in(i); }
  std::vector<Value> list(int i) override { return f_.list(i); }
  std::vector<std::optional<Value>> opt_list(int i) override { return f_.opt_list(i); }
  Value scalar(int i, DType t) override {
    switch (kind(i)) {
      case '1': return b.constant(1, t);
      case 'Z': {
        auto key = std::make_pair(i, t);
        auto it = sh_.scalars.find(key);
        if (it == sh_.scalars.end()) it = sh_.scalars.emplace(key, f_.scalars(i, t)).first;
        return it->second.at(k_);
      }
      case 'V': {
        Value v = list_of(i)[0];
        return b.convert(b.reshape(b.slice(v, {k_}, {k_ + 1}, {1}), {}), t);
      }
      case 'S': {
        auto key = std::make_pair(i, t);
        auto it = sh_.shared_scalars.find(key);
        if (it == sh_.shared_scalars.end()) it = sh_.shared_scalars.emplace(key, f_.scalar(i, t)).first;
        return it->second;
      }
      default: return f_.scalar(i, t);
    }
  }
  std::vector<Value> scalars(int i, DType t) override { return f_.scalars(i, t); }
  bool scalar_is_float(int i) const override {
    if (kind(i) == '1') return false;
    if (kind(i) == 'V') return is_float(f_.type_of(i).dtype);
    return f_.scalar_is_float(i);
  }
  int64_t i(int idx) const override { return f_.i(idx); }
  double f(int idx) const override { return f_.f(idx); }
  bool flag(int idx) const override { return f_.flag(idx); }
  std::vector<int64_t> ints(int idx) const override { return f_.ints(idx); }
  std::string str(int idx) const override { return f_.str(idx); }
  DType dtype_arg(int idx) const override { return f_.dtype_arg(idx); }
  Type type_of(int i) const override {
    if (kind(i) != 'L') return f_.type_of(i);
    auto it = sh_.lists.find(i);
    if (it != sh_.lists.end()) return it->second.at(k_).type;
    throw Unsupported("foreach: type of an unread list");
  }

  int num_outs() const override { return 1; }
  Type out(int) const override { return f_.out(k_); }
  Value random_bits(const Type& t) override { return f_.random_bits(t); }
  Value random_state() override { return f_.random_state(); }
  void check(const Value& ok, const std::string& message) override { f_.check(ok, message); }
  void check_indices(const Value& ok, const std::string& message) override { f_.check_indices(ok, message); }

 private:
  char kind(int i) const { return i < num_args() ? kinds_[i] : 'x'; }
  const std::vector<Value>& list_of(int i) {
    auto it = sh_.lists.find(i);
    if (it == sh_.lists.end()) it = sh_.lists.emplace(i, kind(i) == 'V' ? std::vector<Value>{f_.in(i)} : f_.list(i)).first;
    return it->second;
  }

  Ctx& f_;
  std::string op_, kinds_;
  int64_t k_;
  Shared& sh_;
};

// Lowers a foreach op as `op` applied at every list position.
// (A list position holding complex tensors takes the op's "complex:" rule, as a direct
// call of the op would: complex parameters under a foreach optimizer.)
std::vector<Value> per_element(Ctx& ctx, const char* op, const char* kinds) {
  const Rule* rule = find_rule(op);
  const Rule* complex_rule = find_rule(std::string("complex:") + op);
  if (!rule) throw Unsupported(std::string("foreach: no rule for ") + op);
  ElementCtx::Shared shared;
  std::vector<Value> out;
  int n = ctx.num_outs();
  for (int k = 0; k < n; ++k) {
    ElementCtx ec(ctx, op, kinds, k, shared);
    // Read list arguments first so type_of works inside the element rule.
    bool complex = is_complex(ctx.out(k).dtype);
    for (int i = 0; i < ec.num_args(); ++i)
      if (kinds[i] == 'L') complex = is_complex(ec.in(i).dtype()) || complex;
    out.push_back((*(complex && complex_rule ? complex_rule : rule))(ec)[0]);
  }
  return out;
}
}  // namespace

#define TPU_FOREACH(fn, op, kinds, ...) \
  TPU_LOWER(fn, __VA_ARGS__) { return per_element(ctx, op, kinds); }

// Binary arithmetic: List, Scalar, ScalarList and Tensor (a shared 0-dim tensor) forms.
TPU_FOREACH(fe_add_list, "add.Tensor", "LLS", "_foreach_add.List")
TPU_FOREACH(fe_add_scalar, "add.Scalar", "LS1", "_foreach_add.Scalar")
TPU_FOREACH(fe_add_scalars, "add.Scalar", "LZ1", "_foreach_add.ScalarList")
TPU_FOREACH(fe_add_tensor, "add.Tensor", "LTS", "_foreach_add.Tensor")
TPU_FOREACH(fe_sub_list, "sub.Tensor", "LLS", "_foreach_sub.List")
TPU_FOREACH(fe_sub_scalar, "sub.Scalar", "LS1", "_foreach_sub.Scalar")
TPU_FOREACH(fe_sub_scalars, "sub.Scalar", "LZ1", "_foreach_sub.ScalarList")
TPU_FOREACH(fe_mul_list, "mul.Tensor", "LL", "_foreach_mul.List")
TPU_FOREACH(fe_mul_scalar, "mul.Scalar", "LS", "_foreach_mul.Scalar")
TPU_FOREACH(fe_mul_scalars, "mul.Scalar", "LZ", "_foreach_mul.ScalarList")
TPU_FOREACH(fe_mul_tensor, "mul.Tensor", "LT", "_foreach_mul.Tensor")
TPU_FOREACH(fe_div_list, "div.Tensor", "LL", "_foreach_div.List")
TPU_FOREACH(fe_div_scalar, "div.Scalar", "LS", "_foreach_div.Scalar")
TPU_FOREACH(fe_div_scalars, "div.Scalar", "LZ", "_foreach_div.ScalarList")
TPU_FOREACH(fe_div_tensor, "div.Tensor", "LT", "_foreach_div.Tensor")
TPU_FOREACH(fe_pow_list, "pow.Tensor_Tensor", "LL", "_foreach_pow.List")
TPU_FOREACH(fe_pow_scalar, "pow.Tensor_Scalar", "LS", "_foreach_pow.Scalar")
TPU_FOREACH(fe_pow_scalars, "pow.Tensor_Scalar", "LZ", "_foreach_pow.ScalarList")
TPU_FOREACH(fe_pow_base, "pow.Scalar", "SL", "_foreach_pow.ScalarAndTensor")
TPU_FOREACH(fe_max_list, "maximum", "LL", "_foreach_maximum.List")
TPU_FOREACH(fe_max_scalar, "clamp_min", "LS", "_foreach_maximum.Scalar", "_foreach_clamp_min.Scalar")
TPU_FOREACH(fe_max_scalars, "clamp_min", "LZ", "_foreach_maximum.ScalarList", "_foreach_clamp_min.ScalarList")
TPU_FOREACH(fe_clamp_min_list, "clamp_min.Tensor", "LL", "_foreach_clamp_min.List")
TPU_FOREACH(fe_min_list, "minimum", "LL", "_foreach_minimum.List")
TPU_FOREACH(fe_min_scalar, "clamp_max", "LS", "_foreach_minimum.Scalar", "_foreach_clamp_max.Scalar")
TPU_FOREACH(fe_min_scalars, "clamp_max", "LZ", "_foreach_minimum.ScalarList", "_foreach_clamp_max.ScalarList")
TPU_FOREACH(fe_clamp_max_list, "clamp_max.Tensor", "LL", "_foreach_clamp_max.List")

// Ternary: self + value * t1 (* or /) t2, and lerp. (The .Tensor forms take their
// scalars as a 1-D CPU tensor, which the backend does not pass to programs today.)
TPU_FOREACH(fe_addcmul_scalar, "addcmul", "LLLS", "_foreach_addcmul.Scalar")
TPU_FOREACH(fe_addcmul_scalars, "addcmul", "LLLZ", "_foreach_addcmul.ScalarList")
TPU_FOREACH(fe_addcmul_tensor, "addcmul", "LLLV", "_foreach_addcmul.Tensor")
TPU_FOREACH(fe_addcdiv_scalar, "addcdiv", "LLLS", "_foreach_addcdiv.Scalar")
TPU_FOREACH(fe_addcdiv_scalars, "addcdiv", "LLLZ", "_foreach_addcdiv.ScalarList")
TPU_FOREACH(fe_addcdiv_tensor, "addcdiv", "LLLV", "_foreach_addcdiv.Tensor")
TPU_FOREACH(fe_lerp_list, "lerp.Tensor", "LLL", "_foreach_lerp.List")
TPU_FOREACH(fe_lerp_scalar, "lerp.Scalar", "LLS", "_foreach_lerp.Scalar")
TPU_FOREACH(fe_lerp_scalars, "lerp.Scalar", "LLZ", "_foreach_lerp.ScalarList")

// Unary.
TPU_FOREACH(fe_sqrt, "sqrt", "L", "_foreach_sqrt")
TPU_FOREACH(fe_rsqrt, "rsqrt", "L", "_foreach_rsqrt")
TPU_FOREACH(fe_neg, "neg", "L", "_foreach_neg")
TPU_FOREACH(fe_reciprocal, "reciprocal", "L", "_foreach_reciprocal")
TPU_FOREACH(fe_sign, "sign", "L", "_foreach_sign")
TPU_FOREACH(fe_abs, "abs", "L", "_foreach_abs")
TPU_FOREACH(fe_exp, "exp", "L", "_foreach_exp")
TPU_FOREACH(fe_expm1, "expm1", "L", "_foreach_expm1")
TPU_FOREACH(fe_log, "log", "L", "_foreach_log")
TPU_FOREACH(fe_log1p, "log1p", "L", "_foreach_log1p")
TPU_FOREACH(fe_sigmoid, "sigmoid", "L", "_foreach_sigmoid")
TPU_FOREACH(fe_tanh, "tanh", "L", "_foreach_tanh")
TPU_FOREACH(fe_floor, "floor", "L", "_foreach_floor")
TPU_FOREACH(fe_ceil, "ceil", "L", "_foreach_ceil")
TPU_FOREACH(fe_round, "round", "L", "_foreach_round")
TPU_FOREACH(fe_trunc, "trunc", "L", "_foreach_trunc")
TPU_FOREACH(fe_frac, "frac", "L", "_foreach_frac")
TPU_FOREACH(fe_zero, "zero", "L", "_foreach_zero", "_foreach_zero_")
TPU_FOREACH(fe_copy, "copy", "LLx", "_foreach_copy")

// torch_tpu::stacked_norms (backend/foreach_norm.cpp, behind _foreach_norm): the
// p-norms of a list sorted by shape, as one vector, accumulated in f32 for f16/bf16.
// Each run of equal types is stacked on a new leading dim (at most kNormGroup at a time)
// and reduced together: a few reductions per distinct shape, where a reduction per
// tensor made a model's norms compile for most of a minute. Each row sums as that
// tensor alone would. `ord` is a runtime operand (not part of the signature): each
// element's summand is selected before one sum, and inf/-inf share one max (of |x|, or
// of -|x| for the minimum).
constexpr size_t kNormGroup = 64;

static Value stacked_norm_run(Builder& b, const std::vector<Value>& xs, const Value& p, DType t) {
  std::vector<Value> rows;
  for (const Value& x : xs) {
    Shape s = x.shape();
    s.insert(s.begin(), 1);
    rows.push_back(b.reshape(x, s));
  }
  Value x = rows.size() == 1 ? rows[0] : b.concatenate(rows, 0);
  // A complex element's magnitude (a convert to a real type would keep the real part).
  Value a = is_complex(x.dtype()) ? b.convert(complex_magnitude(b, x), t) : b.unary("stablehlo.abs", b.convert(x, t));
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < a.rank(); ++d) dims.push_back(d);
  auto is = [&](double v, const Shape& s) { return b.compare(broadcast_to(b, p, s), b.constant(v, t, s), ir::Cmp::EQ); };
  const Shape& in = a.shape();
  Value term = b.binary("stablehlo.power", a, broadcast_to(b, p, in));
  term = b.select(is(0, in), b.convert(b.compare(a, full_like(b, a, 0), ir::Cmp::NE), t), term);
  term = b.select(is(1, in), a, term);
  term = b.select(is(2, in), mul(b, a, a), term);
  Value sum = reduce_sum(b, term, dims);
  Value most = reduce_max(b, b.select(is(-INFINITY, in), b.unary("stablehlo.negate", a), a), dims);
  const Shape& s = sum.shape();
  Value r = b.binary("stablehlo.power", sum, div(b, b.constant(1, t, s), broadcast_to(b, p, s)));
  r = b.select(b.binary("stablehlo.or", is(0, s), is(1, s)), sum, r);
  r = b.select(is(2, s), b.unary("stablehlo.sqrt", sum), r);
  r = b.select(is(INFINITY, s), most, r);
  return b.select(is(-INFINITY, s), b.unary("stablehlo.negate", most), r);
}

TPU_LOWER(stacked_norms, "stacked_norms") {
  Builder& b = ctx.b;
  std::vector<Value> xs = ctx.list(0), parts;
  Type o = ctx.out(0);
  DType t = acc_type(o.dtype);
  Value p = ctx.scalar(1, t);
  for (size_t start = 0; start < xs.size();) {
    size_t end = start + 1;
    while (end < xs.size() && end - start < kNormGroup && xs[end].dtype() == xs[start].dtype() && xs[end].shape() == xs[start].shape()) ++end;
    parts.push_back(stacked_norm_run(b, std::vector<Value>(xs.begin() + start, xs.begin() + end), p, t));
    start = end;
  }
  Value r = parts.size() == 1 ? parts[0] : b.concatenate(parts, 0);
  return {b.convert(r, o.dtype)};
}

// Per-tensor maximum.
TPU_LOWER(fe_max, "_foreach_max") {
  std::vector<Value> xs = ctx.list(0), out;
  for (size_t k = 0; k < xs.size(); ++k) {
    Type o = ctx.out(static_cast<int>(k));
    Value r = reduce_max(ctx.b, xs[k], reduce_dims({}, xs[k].rank()));
    out.push_back(ctx.b.convert(ctx.b.reshape(r, o.shape), o.dtype));
  }
  return out;
}

}  // namespace tpu::lowering
