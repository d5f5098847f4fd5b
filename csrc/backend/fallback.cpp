#include "backend/fallback.h"

#include <ATen/native/CPUFallback.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdlib>
#include <set>

#include "backend/executor.h"

namespace tpu::backend {

static bool fallback_is_error() {
  const char* s = std::getenv("TPU_FALLBACK");
  return s && std::string(s) == "error";
}

void run_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& reason) {
  const auto& name = op.operator_name();
  std::string n = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
  std::string why = reason.empty() ? "no tpu lowering" : reason;
  TORCH_CHECK(!fallback_is_error(), "torch_tpu: ", n, " has no native tpu lowering for these arguments (",
              why, ") and TPU_FALLBACK=error forbids the CPU fallback");
  bool first;
  {
    std::lock_guard<std::mutex> lock(metrics().mu);
    int64_t& c = metrics().fallbacks[n];
    first = c == 0;
    ++c;
  }
  if (first) TORCH_WARN("torch_tpu: ", n, " runs on the CPU fallback (", why, "); this copies its tensors through the host");
  at::native::cpu_fallback(op, stack);
}

static void boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_fallback(op, stack);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&boxed_fallback>());
}

}  // namespace tpu::backend
