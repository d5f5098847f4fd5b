// CPU's checks of the random ops' number arguments (bounds, probabilities), which their
// rules read as runtime operands (lowering/registry.h's RuntimeArgs): a plan serves every
// value, so these run at every call, as CPU's kernels check.
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>

#include "backend/kernel_checks.h"

namespace tpu::backend {
// The integers an integral dtype holds (bool: 0 and 1).
std::pair<int64_t, int64_t> integral_range(c10::ScalarType t) {
  switch (t) {
    case c10::kBool: return {0, 1};
    case c10::kByte: return {0, 255};
    case c10::kChar: return {-128, 127};
    case c10::kShort: return {-32768, 32767};
    case c10::kInt: return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    default: return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  }
}

namespace {

// random_(from, to) / random_(to): from < to, then both ends values of the dtype (past a
// float's exact integers CPU only warns, and only float16's range is narrower than int64's).
void random_bounds(c10::ArrayRef<c10::IValue> args) {
  if (args.empty() || !args[0].isTensor()) return;
  c10::ScalarType t = args[0].toTensor().scalar_type();
  if (c10::isComplexType(t)) {
    TORCH_CHECK_NOT_IMPLEMENTED(args.size() >= 3, "\"random_\" not implemented for '", t, "'");
    TORCH_CHECK(false, "random_: check_random_bounds handles only integral, floating-point and boolean types, not '",
                t, "' (as CPU)");
  }
  if (args.size() < 3) return;  // random_(): the dtype's whole range
  std::optional<int64_t> from, to;
  if (args.size() >= 4) {  // (self, from, to?, generator?)
    from = args[1].toInt();
    if (!args[2].isNone()) to = args[2].toInt();
  } else {  // (self, to, generator?)
    to = args[1].toInt();
  }
  if (to) {
    int64_t lo = from.value_or(0);
    TORCH_CHECK(lo < *to, "random_ expects 'from' to be less than 'to', but got from=", lo, " >= to=", *to);
  }
  int64_t lo, hi;
  if (t == c10::kHalf) {
    lo = -65504, hi = 65504;
  } else if (c10::isIntegralType(t, /*includeBool=*/true)) {
    std::tie(lo, hi) = integral_range(t);
  } else {
    return;
  }
  std::string name(c10::scalarTypeToTypeMeta(t).name());
  TORCH_CHECK(!from || (*from >= lo && *from <= hi), "from is out of bounds for ", name);
  TORCH_CHECK(!to || *to == std::numeric_limits<int64_t>::min() || (*to - 1 >= lo && *to - 1 <= hi),
              "to - 1 is out of bounds for ", name);
}

// uniform_(from, to): both ends values of the dtype, from <= to, and to - from finite in it.
void uniform_bounds(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 3 || !args[0].isTensor() || !args[1].isDouble() || !args[2].isDouble()) return;
  c10::ScalarType t = args[0].toTensor().scalar_type();
  double top;
  const char* limits;  // CPU names the type twice, two ways
  switch (t) {
    case c10::kDouble: top = std::numeric_limits<double>::max(), limits = "Double"; break;
    case c10::kFloat: top = std::numeric_limits<float>::max(), limits = "Float"; break;
    case c10::kHalf: top = 65504.0, limits = "Half"; break;
    case c10::kBFloat16: top = 3.3895313892515355e38, limits = "BFloat16"; break;
    default: return;  // the rule refuses other dtypes
  }
  std::string name(c10::scalarTypeToTypeMeta(t).name());
  double from = args[1].toDouble(), to = args[2].toDouble();
  TORCH_CHECK(from >= -top && from <= top, "from is out of bounds for ", name);
  TORCH_CHECK(to >= -top && to <= top, "to is out of bounds for ", name);
  TORCH_CHECK(from <= to, "uniform_ expects to return a [from, to) range, but found from=", from, " > to=", to);
  TORCH_CHECK(to - from <= top, "uniform_ expects to-from <= std::numeric_limits<", limits, ">::max(), but found to=",
              to, " and from=", from, " which result in to-from to exceed the limit");
}

// bernoulli_(p) / bernoulli(self, p) with a float p: within [0, 1] (a tensor p is checked
// by the program, as CUDA's kernel does).
void bernoulli_probability(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[1].isDouble()) return;
  double p = args[1].toDouble();
  TORCH_CHECK(p >= 0 && p <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", p);
}

// native_dropout(x, p, train): CPU's kernel draws its mask with bernoulli_(1 - p), whose
// check is the error (F.dropout checks p first, with its own message).
void dropout_probability(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[1].isDouble()) return;
  bool train = args.size() < 3 || args[2].isNone() || args[2].toBool();
  double q = 1 - args[1].toDouble();
  TORCH_CHECK(!train || (q >= 0 && q <= 1), "bernoulli_ expects p to be in [0, 1], but got p=", q);
}

}  // namespace

KernelCheck random_value_check_for(const std::string& base) {
  static const std::unordered_map<std::string, KernelCheck> checks = {
      {"random", &random_bounds},
      {"uniform", &uniform_bounds},
      {"bernoulli", &bernoulli_probability},
      {"native_dropout", &dropout_probability},
  };
  auto it = checks.find(base);
  return it == checks.end() ? nullptr : it->second;
}

}  // namespace tpu::backend
