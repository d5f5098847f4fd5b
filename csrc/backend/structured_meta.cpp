#include "backend/structured_meta.h"

#include <ATen/MetaFunctions.h>
#include <ATen/Operators.h>

#include <cstdlib>
#include <string>
#include <unordered_map>

namespace tpu::backend {
namespace {

using Table = std::unordered_map<c10::OperatorName, c10::KernelFunction>;

// `fn` must have the exact signature of the op's schema (Op::schema picks the overload).
template <class Op>
void add(Table& t, typename Op::schema* fn) {
  t.emplace(c10::OperatorName(Op::name, Op::overload_name),
            c10::KernelFunction::makeFromUnboxedRuntimeFunction(fn));
}

const Table& table() {
  static const Table t = [] {
    Table t;
#define TPU_CXX_META(op, fn) add<at::_ops::op>(t, &at::meta::fn);
#include "backend/structured_meta_ops.inc"
#undef TPU_CXX_META
    return t;
  }();
  return t;
}

}  // namespace

const c10::KernelFunction* cxx_meta_kernel(const c10::OperatorName& name) {
  static const bool off = [] {
    const char* s = std::getenv("TPU_CXX_META");
    return s && std::string(s) == "0";
  }();
  if (off) return nullptr;
  auto it = table().find(name);
  return it == table().end() ? nullptr : &it->second;
}

}  // namespace tpu::backend
