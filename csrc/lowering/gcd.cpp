// Greatest common divisor and least common multiple of integers, as CPU's kernels
// compute them: Euclid's algorithm on |a| and |b| (|min| stays min, as in C++), and
// lcm = |a / gcd * b| (0 where gcd is 0).
#include "lowering/elementwise.h"
#include "lowering/registry.h"

namespace tpu::lowering {

using namespace ew;
using ir::Cmp;

namespace {

Value magnitude(Builder& b, const Value& x) { return is_signed_int(x.dtype()) ? op1(b, "abs", x) : x; }

// One loop over all elements: it runs as many steps as the slowest pair needs, and a pair
// done (a == 0) keeps its b.
Value gcd_of(Builder& b, const Value& x, const Value& y) {
  std::vector<int64_t> all;
  for (int64_t d = 0; d < x.rank(); ++d) all.push_back(d);
  auto out = b.while_loop(
      {magnitude(b, x), magnitude(b, y)},
      [&](Builder& q, const std::vector<Value>& s) {
        Value busy = q.convert(cmpk(q, s[0], 0, Cmp::NE), DType::I32);
        if (!all.empty()) busy = reduce_max(q, busy, all);
        return std::vector<Value>{q.compare(busy, q.constant(0, DType::I32), Cmp::NE)};
      },
      [&](Builder& q, const std::vector<Value>& s) {
        Value busy = cmpk(q, s[0], 0, Cmp::NE);
        Value r = op2(q, "remainder", s[1], q.select(busy, s[0], cst(q, s[0], 1)));
        return std::vector<Value>{q.select(busy, r, s[0]), q.select(busy, s[0], s[1])};
      });
  return out[1];
}

void require_integer(Ctx& ctx, const char* what) {
  for (int i : {0, 1})
    if (!is_integral(ctx.type_of(i).dtype) || ctx.type_of(i).dtype == DType::Bool) throw DtypeNotImplemented(what);
}

}  // namespace

TPU_LOWER(gcd_rule, "gcd") {
  require_integer(ctx, "gcd_cpu");
  return map(ctx, {0, 1}, [](Builder& b, const Vs& v) { return gcd_of(b, v[0], v[1]); });
}

// C++ computes |a / g * b| of narrower integers as int (the product wraps at 32 bits,
// not at the dtype's): so does this, then the result wraps to the dtype.
static Value widened(Builder& b, const Value& x) { return itemsize(x.dtype()) < 4 ? b.convert(x, DType::I32) : x; }

TPU_LOWER(lcm_rule, "lcm") {
  require_integer(ctx, "lcm_cpu");
  return map(ctx, {0, 1}, [](Builder& b, const Vs& v) {
    Value g = gcd_of(b, v[0], v[1]);
    Value zero = cmpk(b, g, 0, Cmp::EQ);
    Value l = magnitude(b, mul(b, div(b, widened(b, v[0]), widened(b, b.select(zero, cst(b, g, 1), g))),
                               widened(b, v[1])));
    return b.convert(b.select(zero, cst(b, l, 0), l), v[0].dtype());
  });
}

}  // namespace tpu::lowering
