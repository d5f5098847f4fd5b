#include "lowering/helpers.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tpu::lowering {

static int rank_of(DType t) {
  switch (t) {
    case DType::Bool: return 0;
    case DType::U8: return 1;
    case DType::I8: return 2;
    case DType::I16: return 3;
    case DType::I32: return 4;
    case DType::I64: return 5;
    case DType::F16: return 6;
    case DType::BF16: return 7;
    case DType::F32: return 8;
    case DType::F64: return 9;
    case DType::C64: return 10;
    case DType::C128: return 11;
    default: return -1;
  }
}

DType promote(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::F16 && b == DType::BF16) || (a == DType::BF16 && b == DType::F16)) return DType::F32;
  if ((a == DType::U8 && b == DType::I8) || (a == DType::I8 && b == DType::U8)) return DType::I16;
  return rank_of(a) >= rank_of(b) ? a : b;
}

static int category(DType t) { return t == DType::Bool ? 0 : is_integral(t) ? 1 : is_complex(t) ? 3 : 2; }

DType result_type(const std::vector<Value>& xs) {
  bool have_dim = false, have_zero = false;
  DType dim_t = DType::Bool, zero_t = DType::Bool;
  for (auto& x : xs) {
    if (x.rank() > 0) {
      dim_t = have_dim ? promote(dim_t, x.dtype()) : x.dtype();
      have_dim = true;
    } else {
      zero_t = have_zero ? promote(zero_t, x.dtype()) : x.dtype();
      have_zero = true;
    }
  }
  if (!have_dim) return zero_t;
  if (have_zero && category(zero_t) > category(dim_t)) return zero_t == DType::F64 ? DType::F32 : zero_t;
  return dim_t;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

bool broadcastable(const Shape& a, const Shape& b) {
  for (size_t i = 1; i <= std::min(a.size(), b.size()); ++i) {
    int64_t da = a[a.size() - i], db = b[b.size() - i];
    if (da != db && da != 1 && db != 1) return false;
  }
  return true;
}

bool expandable(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 1; i <= from.size(); ++i) {
    int64_t f = from[from.size() - i];
    if (f != 1 && f != to[to.size() - i]) return false;
  }
  return true;
}

Value broadcast_to(Builder& b, const Value& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  if (x.shape().size() > shape.size()) {
    size_t extra = x.shape().size() - shape.size();
    for (size_t i = 0; i < extra; ++i)
      if (x.shape()[i] != 1) throw std::logic_error("internal: broadcast_to a shape of lower rank");
    return broadcast_to(b, b.reshape(x, Shape(x.shape().begin() + extra, x.shape().end())), shape);
  }
  size_t off = shape.size() - x.shape().size();
  // Size-1 dims that grow must be dropped first: broadcast_in_dim maps them as is.
  Shape kept_shape;
  std::vector<int64_t> dims;
  for (size_t i = 0; i < x.shape().size(); ++i) {
    if (x.shape()[i] == 1 && shape[off + i] != 1) continue;
    kept_shape.push_back(x.shape()[i]);
    dims.push_back(static_cast<int64_t>(off + i));
  }
  Value y = b.reshape(x, kept_shape);
  return b.broadcast_in_dim(y, shape, dims);
}

Value convert_any(Builder& b, const Value& x, DType t) {
  if (x.dtype() == t) return x;
  // The Builder spells a zero of the source type for bool's nonzero test, and no
  // fp8 literal parses: test in f32 (exact for every fp8 value).
  if (is_fp8(x.dtype()) && t == DType::Bool) return b.convert(b.convert(x, DType::F32), t);
  if (!is_fp8(t) || is_complex(x.dtype())) return b.convert(x, t);
  // c10 converts to fp8 from float (a double is narrowed first: two roundings, as on
  // CPU), and e4m3fn, which has no inf, saturates finite overflow and inf to +-448
  // where XLA gives NaN (NaN stays NaN through the clamp).
  Value f = b.convert(x, DType::F32);
  if (t == DType::F8E4M3FN) {
    Value lim = b.constant(448.0, DType::F32, f.shape());
    f = b.clamp(b.unary("stablehlo.negate", lim), f, lim);
  }
  Value y = b.convert(f, t);
  if (t != DType::F8E5M2) return y;
  // XLA:CPU's e5m2 NaN is 0x7E, c10's 0x7F (with the input's sign): give c10's bits.
  if (!is_float(x.dtype())) return y;  // no NaN to convert
  const Shape& s = f.shape();
  // The sign of the source's NaN (XLA's conversions need not keep it).
  int64_t w = itemsize(x.dtype());
  DType it = w == 1 ? DType::I8 : w == 2 ? DType::I16 : w == 4 ? DType::I32 : DType::I64;
  // (An fnuz NaN, 0x80, reads as a positive NaN in c10.)
  bool fnuz = x.dtype() == DType::F8E4M3FNUZ || x.dtype() == DType::F8E5M2FNUZ;
  Value negative = fnuz ? b.constant(0, DType::Bool, s)
                        : b.compare(b.bitcast(x, it), b.constant(0, it, s), ir::Cmp::LT);
  Value bits = b.select(negative, b.constant(255, DType::U8, s), b.constant(127, DType::U8, s));
  // (Selected as bytes: an fp8 select lost the NaN's sign on XLA:CPU.)
  return b.bitcast(b.select(b.compare(f, f, ir::Cmp::NE), bits, b.bitcast(y, DType::U8)), t);
}

Value constant_any(Builder& b, double v, DType t, const Shape& shape) {
  if (!is_fp8(t)) return b.constant(v, t, shape);
  return b.convert(b.constant(v, DType::F32, shape), t);  // spelled in f32, narrowed by XLA
}

Value coerce(Builder& b, const Value& x, DType t, const Shape& shape) {
  return broadcast_to(b, convert_any(b, x, t), shape);
}

int64_t wrap_dim(int64_t d, int64_t rank) {
  int64_t r = std::max<int64_t>(rank, 1);
  // out_of_range: the backend raises it as PyTorch's IndexError.
  if (d < -r || d >= r) throw std::out_of_range("dimension " + std::to_string(d) +
                                                " out of range for rank " + std::to_string(rank));
  return d < 0 ? d + r : d;
}

std::vector<int64_t> reduce_dims(const std::vector<int64_t>& dims, int64_t rank) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (auto d : dims) {
    if (rank == 0) continue;
    out.push_back(wrap_dim(d, rank));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Value full_like(Builder& b, const Value& like, double v) { return constant_any(b, v, like.dtype(), like.shape()); }

Value keep_dims(Builder& b, const Value& reduced, const Shape& in_shape,
                const std::vector<int64_t>& dims) {
  Shape s = in_shape;
  for (auto d : dims) s[d] = 1;
  return b.reshape(reduced, s);
}

double lowest(DType t) {
  switch (t) {
    case DType::Bool: return 0;
    case DType::U8: case DType::U16: case DType::U32: case DType::U64: return 0;
    case DType::I8: return -128;
    case DType::I16: return -32768;
    case DType::I32: return -2147483648.0;
    case DType::I64: return static_cast<double>(std::numeric_limits<int64_t>::min());
    default: return -std::numeric_limits<double>::infinity();
  }
}

double highest(DType t) {
  switch (t) {
    case DType::Bool: return 1;
    case DType::U8: return 255;
    case DType::U16: return 65535;
    case DType::U32: return 4294967295.0;
    case DType::I8: return 127;
    case DType::I16: return 32767;
    case DType::I32: return 2147483647.0;
    case DType::I64: return 9223372036854775807.0;
    default: return std::numeric_limits<double>::infinity();
  }
}

DType acc_type(DType t) { return (t == DType::F16 || t == DType::BF16 || is_fp8(t)) ? DType::F32 : t; }

std::string shape_text(const Shape& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

Value reduce_sum(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  return b.reduce(x, b.constant(0, x.dtype()), dims, "stablehlo.add");
}
// max/min that propagate NaN like PyTorch (XLA:CPU's reduce may drop it).
static Value reduce_extreme(Builder& b, const Value& x, const std::vector<int64_t>& dims,
                            const char* op, double init) {
  bool fp = is_float(x.dtype());
  return b.reduce({x}, {b.constant(init, x.dtype())}, dims, [&](Builder& r, const std::vector<Value>& a) {
    Value m = r.binary(op, a[0], a[1]);
    if (fp) {
      m = r.select(r.compare(a[1], a[1], ir::Cmp::NE), a[1], m);
      m = r.select(r.compare(a[0], a[0], ir::Cmp::NE), a[0], m);
    }
    return std::vector<Value>{m};
  })[0];
}
Value reduce_max(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  return reduce_extreme(b, x, dims, "stablehlo.maximum", lowest(x.dtype()));
}
Value reduce_min(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  return reduce_extreme(b, x, dims, "stablehlo.minimum", highest(x.dtype()));
}

Value add(Builder& b, const Value& x, const Value& y) { return b.binary("stablehlo.add", x, y); }
Value sub(Builder& b, const Value& x, const Value& y) { return b.binary("stablehlo.subtract", x, y); }
Value mul(Builder& b, const Value& x, const Value& y) { return b.binary("stablehlo.multiply", x, y); }
Value div(Builder& b, const Value& x, const Value& y) { return b.binary("stablehlo.divide", x, y); }

Value div_count(Builder& b, const Value& x, double n) {
  // Every count an operand, powers of two too (their literal would be exact): a program
  // then keeps its operands as the size changes, so shape churn (a decode loop's growing
  // length) sees one structure, not another at each power of two.
  if (is_complex(x.dtype())) return div(b, x, b.constant(n, x.dtype(), x.shape()));
  return div(b, x, broadcast_to(b, b.number(n, x.dtype()), x.shape()));
}

Value reduce_precision(Builder& b, const Value& x, DType t) {
  bool bf = t == DType::BF16;
  if (!bf && t != DType::F16) throw std::logic_error("internal: reduce_precision to a dtype other than bf16/f16");
  return b.raw("stablehlo.reduce_precision", {x},
               std::string("exponent_bits = ") + (bf ? "8" : "5") + " : i32, mantissa_bits = " + (bf ? "7" : "10") + " : i32",
               x.type);
}

Value mul_uncontracted(Builder& b, const Value& x, const Value& y) {
  DType bits = x.dtype() == DType::F64 ? DType::I64 : DType::I32;
  Value p = b.bitcast(mul(b, x, y), bits);
  p = b.binary("stablehlo.xor", p, broadcast_to(b, b.number(0, bits), p.shape()));
  return b.bitcast(p, x.dtype());
}

Value opaque(Builder& b, const Value& c) {
  return mul(b, c, broadcast_to(b, b.number(1, c.dtype()), c.shape()));
}

Value matmul2d(Builder& b, const Value& x, const Value& y, DType out) {
  DType acc = acc_type(out);
  Value r = b.dot_general(b.convert(x, out), b.convert(y, out), {}, {}, {1}, {0}, acc, ir::DotPrecision::Highest);
  return b.convert(r, out);
}

Value all_in_range(Builder& b, const Value& idx, int64_t lo, int64_t hi) {
  if (idx.type.numel() == 0) return b.constant(1, DType::Bool);
  Value x = b.convert(idx, DType::I64);
  Value ge = b.compare(x, b.constant(static_cast<double>(lo), DType::I64, x.shape()), ir::Cmp::GE);
  Value lt = b.compare(x, b.constant(static_cast<double>(hi), DType::I64, x.shape()), ir::Cmp::LT);
  Value ok = b.convert(b.binary("stablehlo.and", ge, lt), DType::I32);
  std::vector<int64_t> all;
  for (int64_t d = 0; d < x.rank(); ++d) all.push_back(d);
  Value m = x.rank() ? reduce_min(b, ok, all) : ok;
  return b.compare(m, b.constant(1, DType::I32), ir::Cmp::EQ);
}

void check_in_range(Ctx& ctx, const Value& idx, int64_t lo, int64_t hi, const std::string& message) {
  if (idx.type.numel() == 0) return;
  // No index fits an empty range (a dim of size 0): the call fails whatever the values,
  // and an empty result's program, which is not run, would not say so.
  if (hi <= lo) throw CheckFailed(message);
  ctx.check_indices(all_in_range(ctx.b, idx, lo, hi), message);
}

void require_float(Ctx& ctx, int arg, const char* what) {
  DType t = ctx.type_of(arg).dtype;
  if (!is_float(t) && !is_complex(t)) throw DtypeNotImplemented(what);
}

Value all_true(Builder& b, const Value& pred) {
  if (pred.type.numel() == 0) return b.constant(1, DType::Bool);
  if (pred.rank() == 0) return pred;
  std::vector<int64_t> all;
  for (int64_t d = 0; d < pred.rank(); ++d) all.push_back(d);
  return b.reduce(pred, b.constant(1, DType::Bool), all, "stablehlo.and");
}

Value masked_pick(Builder& b, const Value& x, const Value& mask, int64_t dim) {
  int64_t size = itemsize(x.dtype());
  DType bits = size == 8 ? DType::I64 : size == 4 ? DType::I32 : size == 2 ? DType::I16 : DType::I8;
  Value v = x.dtype() == DType::Bool ? b.convert(x, DType::I8) : b.bitcast(x, bits);
  Value picked = b.select(mask, v, full_like(b, v, 0));
  Value r = b.reduce(picked, b.constant(0, bits), {dim}, "stablehlo.or");
  return x.dtype() == DType::Bool ? b.convert(r, DType::Bool) : b.bitcast(r, x.dtype());
}

static Type part_type(const Value& z) {
  return Type{z.dtype() == DType::C128 ? DType::F64 : DType::F32, z.shape()};
}

Value complex_magnitude(Builder& b, const Value& z) {
  Type part = part_type(z);
  Value re = b.raw("stablehlo.real", {z}, "", part), im = b.raw("stablehlo.imag", {z}, "", part);
  Value r = b.raw("stablehlo.abs", {z}, "", part);
  auto either = [&](ir::Cmp dir, double v) {
    auto test = [&](const Value& p) {
      Value x = dir == ir::Cmp::NE ? p : b.unary("stablehlo.abs", p);
      return b.compare(x, dir == ir::Cmp::NE ? p : b.constant(v, p.dtype(), p.shape()), dir);
    };
    return b.binary("stablehlo.or", test(re), test(im));
  };
  r = b.select(either(ir::Cmp::NE, 0), b.constant(NAN, part.dtype, part.shape), r);
  return b.select(either(ir::Cmp::EQ, INFINITY), b.constant(INFINITY, part.dtype, part.shape), r);
}

Value complex_abs_squared(Builder& b, const Value& z) {
  Type part = part_type(z);
  Value re = b.raw("stablehlo.real", {z}, "", part), im = b.raw("stablehlo.imag", {z}, "", part);
  return add(b, mul(b, re, re), mul(b, im, im));
}

}  // namespace tpu::lowering
