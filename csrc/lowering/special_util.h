// Small numeric building blocks shared by the special_*.cpp rule files: polynomial
// and Chebyshev series evaluation, masks and a few elementary functions, all on
// values of one float dtype.
#pragma once
#include <cmath>
#include <initializer_list>
#include <utility>
#include <vector>

#include "lowering/elementwise.h"

namespace tpu::lowering::sp {

using namespace ew;
using ir::Cmp;

inline Value K(Builder& b, const Value& like, double v) { return cst(b, like, v); }
inline Value and_(Builder& b, const Value& x, const Value& y) { return op2(b, "and", x, y); }
inline Value or_(Builder& b, const Value& x, const Value& y) { return op2(b, "or", x, y); }
inline Value not_(Builder& b, const Value& x) { return op1(b, "not", x); }
inline Value isnan_(Builder& b, const Value& x) { return cmp(b, x, x, Cmp::NE); }
inline Value isinf_(Builder& b, const Value& x) { return cmpk(b, op1(b, "abs", x), INFINITY, Cmp::EQ); }
inline Value sqrt_(Builder& b, const Value& x) { return op1(b, "sqrt", x); }
inline Value exp_(Builder& b, const Value& x) { return op1(b, "exponential", x); }
inline Value log_(Builder& b, const Value& x) { return op1(b, "log", x); }
inline Value abs_(Builder& b, const Value& x) { return op1(b, "abs", x); }
inline Value neg_(Builder& b, const Value& x) { return op1(b, "negate", x); }

// acos through atan2; (1 - x)(1 + x) keeps its accuracy next to |x| = 1.
inline Value acos_(Builder& b, const Value& x) {
  Value s = sqrt_(b, mul(b, sub(b, K(b, x, 1), x), add(b, K(b, x, 1), x)));
  return op2(b, "atan2", s, x);
}

// c[0] z^(n-1) + ... + c[n-1], by Horner's rule (highest power first).
inline Value horner(Builder& b, const Value& z, const std::vector<double>& c) {
  Value p = K(b, z, c[0]);
  for (size_t i = 1; i < c.size(); ++i) p = add(b, mul(b, p, z), K(b, z, c[i]));
  return p;
}

// Sum of a Chebyshev series at y (in the doubled-argument convention: y = 2t),
// evaluated by Clenshaw's backward recurrence; c[0] is the highest order.
inline Value chebyshev(Builder& b, const Value& y, const std::vector<double>& c) {
  Value b0 = K(b, y, c[0]), b1 = K(b, y, 0), b2 = b1;
  for (size_t i = 1; i < c.size(); ++i) {
    b2 = b1;
    b1 = b0;
    b0 = add(b, sub(b, mul(b, y, b1), b2), K(b, y, c[i]));
  }
  return mul(b, K(b, y, 0.5), sub(b, b0, b2));
}

// a * c exactly, as hi + lo (Dekker's product: Veltkamp's split halves each significand so
// the partial products are exact). Float32 or float64 values of moderate size (the split
// overflows past 1e35 in float32).
inline std::pair<Value, Value> two_product(Builder& b, const Value& a, const Value& c) {
  double k = a.dtype() == DType::F64 ? 134217729.0 : 4097.0;  // 2^27 + 1, 2^12 + 1
  auto split = [&](const Value& v) {
    Value t = mul(b, v, K(b, v, k));
    Value hi = sub(b, t, sub(b, t, v));
    return std::pair{hi, sub(b, v, hi)};
  };
  Value p = mul(b, a, c);
  auto [ah, al] = split(a);
  auto [ch, cl] = split(c);
  Value e = add(b, add(b, add(b, sub(b, mul(b, ah, ch), p), mul(b, ah, cl)), mul(b, al, ch)), mul(b, al, cl));
  return {p, e};
}

// True (a bool scalar) if any element of the mask is.
inline Value any_true(Builder& b, const Value& mask) {
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < mask.rank(); ++i) dims.push_back(i);
  if (dims.empty()) return mask;
  return b.reduce(mask, b.constant(0, DType::Bool), dims, "stablehlo.or");
}

// x rounded to an integer toward zero.
inline Value trunc_(Builder& b, const Value& x) {
  return b.select(cmpk(b, x, 0, Cmp::LT), op1(b, "ceil", x), op1(b, "floor", x));
}

}  // namespace tpu::lowering::sp

namespace tpu::lowering::sp {

// XLA's CPU float unit treats subnormal operands as zero; these look at the bits.
// Nonzero subnormal (either sign), for float32/float64 values.
inline Value is_subnormal(Builder& b, const Value& x) {
  bool wide = x.dtype() == DType::F64;
  DType it = wide ? DType::I64 : DType::I32;
  Value bits = b.bitcast(x, it);
  Value mag = op2(b, "and", bits, op2(b, "shift_right_logical", b.constant(-1, it, x.shape()),
                                      b.constant(1, it, x.shape())));
  Value min_normal = b.constant(wide ? 4503599627370496.0 : 8388608.0, it, x.shape());  // 2^52, 2^23
  return and_(b, b.compare(mag, b.constant(0, it, x.shape()), Cmp::NE),
              b.compare(mag, min_normal, Cmp::LT));
}

// Sign bit set (negative numbers, -0.0, subnormals included).
inline Value signbit(Builder& b, const Value& x) {
  DType it = x.dtype() == DType::F64 ? DType::I64 : DType::I32;
  return b.compare(b.bitcast(x, it), b.constant(0, it, x.shape()), Cmp::LT);
}

// x == 0 and x < 0 as the CPU sees them (a subnormal is neither zero nor, when
// positive, negative).
inline Value is_zero(Builder& b, const Value& x) {
  return and_(b, cmpk(b, x, 0, Cmp::EQ), not_(b, is_subnormal(b, x)));
}
inline Value is_neg(Builder& b, const Value& x) {
  return or_(b, cmpk(b, x, 0, Cmp::LT), and_(b, signbit(b, x), is_subnormal(b, x)));
}

// log(x) for x >= 0 with subnormal x exact: log(significand) + log(2^-149 or 2^-1074).
inline Value log_exact(Builder& b, const Value& x) {
  bool wide = x.dtype() == DType::F64;
  DType it = wide ? DType::I64 : DType::I32;
  Value m = b.convert(b.bitcast(x, it), x.dtype());
  Value sub = add(b, log_(b, m), K(b, x, (wide ? -1074 : -149) * M_LN2));
  return b.select(is_subnormal(b, x), sub, log_(b, x));
}

// num / x with subnormal x exact: 1/x = (2^126 / m) * 2^23 for x = m * 2^-149
// (float64: 2^1022 and 2^52), then the sign.
inline Value div_exact(Builder& b, const Value& num, const Value& x) {
  bool wide = x.dtype() == DType::F64;
  DType it = wide ? DType::I64 : DType::I32;
  Value bits = b.bitcast(x, it);
  Value mag = op2(b, "and", bits, op2(b, "shift_right_logical", b.constant(-1, it, x.shape()),
                                      b.constant(1, it, x.shape())));
  Value m = b.convert(mag, x.dtype());
  Value r = mul(b, div(b, K(b, x, std::ldexp(1.0, wide ? 1022 : 126)), m), K(b, x, std::ldexp(1.0, wide ? 52 : 23)));
  r = b.select(signbit(b, x), neg_(b, r), r);
  return b.select(is_subnormal(b, x), mul(b, num, r), div(b, num, x));
}

}  // namespace tpu::lowering::sp
