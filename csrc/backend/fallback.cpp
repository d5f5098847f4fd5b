#include "backend/fallback.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/native/CPUFallback.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdlib>
#include <set>

#include "backend/device.h"
#include "backend/executor.h"
#include "backend/storage.h"

namespace tpu::backend {

static bool fallback_is_error() {
  const char* s = std::getenv("TPU_FALLBACK");
  return s && std::string(s) == "error";
}

// The device an op's arguments are on (the current one when none is a tpu tensor).
static int tpu_device_of(const torch::jit::Stack& args) {
  for (const c10::IValue& v : args) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_privateuseone())
      return v.toTensor().device().index();
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList())
        if (t.defined() && t.device().is_privateuseone()) return t.device().index();
  }
  return current_device();
}

// A random op on the fallback draws from a CPU generator seeded from the tpu generator
// it was given (or the device's default), which advances as a lowered random op's draw
// does: torch.tpu.manual_seed, get/set_rng_state and tpu Generators govern its values
// too, and a tpu Generator is not refused by CPU's kernel.
static void draw_from_tpu_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema_args = op.schema().arguments();
  const size_t first = stack->size() - schema_args.size();
  for (size_t i = 0; i < schema_args.size(); ++i) {
    c10::TypePtr type = schema_args[i].type();
    if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
    if (type->kind() != c10::TypeKind::GeneratorType) continue;
    c10::IValue& v = (*stack)[first + i];
    std::optional<at::Generator> given;
    if (v.isGenerator()) {
      given = v.toGenerator();
      if (given->device().is_cpu()) continue;  // the user's own CPU generator
    }
    torch::jit::Stack args(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
    auto [seed, counter] = next_rng_state(given, given ? given->device().index() : tpu_device_of(args));
    // One CPU stream per (seed, draw): splitmix64 of the pair.
    uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (counter + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    v = at::make_generator<at::CPUGeneratorImpl>(z ^ (z >> 31));
  }
}

namespace {
template <typename F>
void for_each_tensor(const c10::IValue& v, const F& fn) {
  if (v.isTensor()) {
    fn(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) fn(t);
  } else if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {
    auto l = v.toOptionalTensorList();
    for (size_t j = 0; j < l.size(); ++j)
      if (std::optional<at::Tensor> o = l.get(j)) fn(*o);
  }
}
}  // namespace

void check_written_on_tpu(c10::ArrayRef<c10::IValue> args, c10::ArrayRef<int> written) {
  std::optional<at::Device> host;
  for (int a : written)
    for_each_tensor(args[a], [&](const at::Tensor& t) {
      if (!host && t.defined() && !t.is_privateuseone()) host = t.device();
    });
  if (!host) return;
  std::optional<at::Device> tpu;
  std::optional<c10::DeviceType> generator;
  for (const c10::IValue& v : args) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (!tpu && t.defined() && t.is_privateuseone())
        tpu = at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_index(t)));
    });
    if (v.isGenerator() && v.toGenerator().device().type() != host->type()) generator = v.toGenerator().device().type();
  }
  TORCH_CHECK(!tpu, "Expected all tensors to be on the same device, but found at least two devices, ", *tpu, " and ",
              *host, "!");
  // No tpu tensor: a tpu Generator brought the op here, which CPU's kernel refuses.
  TORCH_CHECK(!generator, "Expected a '", host->type(), "' device type for generator but found '", *generator, "'");
}

void run_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& reason) {
  const auto& schema_args = op.schema().arguments();
  std::vector<int> written;
  for (size_t i = 0; i < schema_args.size(); ++i)
    if (schema_args[i].alias_info() && schema_args[i].alias_info()->isWrite()) written.push_back(static_cast<int>(i));
  // (cpu_fallback would write a cpu argument back through a tpu copy kernel)
  check_written_on_tpu(torch::jit::last(*stack, schema_args.size()), written);
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
  draw_from_tpu_generators(op, stack);
  at::native::cpu_fallback(op, stack);
}

static void boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_fallback(op, stack);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&boxed_fallback>());
}

// Nested tensors of layout torch.strided: PyTorch has their kernels on CPU and CUDA only
// (jagged ones are a Python subclass over ordinary tensors, and run on tpu).
static void strided_nested_refusal(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_tpu: ", op.operator_name(), " on a nested tensor of layout ",
                              "torch.strided: PyTorch has kernels for that layout on CPU and CUDA only; build it ",
                              "with torch.nested.nested_tensor(..., layout=torch.jagged), which runs on tpu");
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&strided_nested_refusal>());
}

// Refused where it is made: autograd asks a new nested tensor that requires grad for its
// sizes in a noexcept function, where the refusal above would end the process.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_nested_tensor_from_tensor_list", torch::CppFunction::makeFromBoxedFunction<&strided_nested_refusal>());
}

}  // namespace tpu::backend
