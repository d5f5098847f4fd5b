#include "backend/foreach_order.h"

#include <map>
#include <vector>

#include <ATen/ATen.h>

namespace tpu::backend {

namespace {

size_t list_length(const c10::IValue& v) {
  if (v.isTensorList()) return v.toTensorList().size();
  if (v.isList()) return v.toListRef().size();
  return 0;
}

}  // namespace

bool foreach_elements_share_memory(c10::ArrayRef<c10::IValue> args, int written_arg) {
  if (!args[written_arg].isTensorList()) return false;
  // Each written storage with the element that writes it (-1: written by two).
  std::map<const c10::StorageImpl*, int64_t> written;
  auto written_list = args[written_arg].toTensorList();
  for (size_t k = 0; k < written_list.size(); ++k) {
    const at::Tensor& t = written_list.get(k);
    if (!t.defined()) continue;
    auto [it, fresh] = written.emplace(t.storage().unsafeGetStorageImpl(), static_cast<int64_t>(k));
    if (!fresh) return true;  // two elements write one storage
  }
  for (size_t a = 0; a < args.size(); ++a) {
    if (static_cast<int>(a) == written_arg || !args[a].isTensorList()) continue;
    auto list = args[a].toTensorList();
    for (size_t k = 0; k < list.size(); ++k) {
      const at::Tensor& t = list.get(k);
      if (!t.defined()) continue;
      auto it = written.find(t.storage().unsafeGetStorageImpl());
      if (it != written.end() && it->second != static_cast<int64_t>(k)) return true;
    }
  }
  return false;
}

bool foreach_spans_devices(c10::ArrayRef<c10::IValue> args) {
  int device = -1;
  for (const c10::IValue& v : args) {
    if (!v.isTensorList()) continue;
    for (const at::Tensor& t : v.toTensorList()) {
      if (!t.defined() || !t.is_privateuseone()) continue;
      int d = t.device().index();
      if (device >= 0 && d != device) return true;
      device = d;
    }
  }
  return false;
}

void run_foreach_per_element(const c10::OperatorHandle& op, torch::jit::Stack* stack, int num_args) {
  std::vector<c10::IValue> args(stack->end() - num_args, stack->end());
  size_t n = 0;
  for (const c10::IValue& v : args) n = std::max(n, list_length(v));
  std::vector<c10::List<at::Tensor>> returns;  // one per return, once the first call gave them
  for (size_t k = 0; k < n; ++k) {
    torch::jit::Stack one;
    for (const c10::IValue& v : args) {
      if (v.isTensorList()) {
        auto l = v.toTensorList();
        TORCH_CHECK(k < l.size(), op.schema().name(), ": tensor lists must have the same length, got ", l.size(),
                    " and ", n);
        one.emplace_back(c10::List<at::Tensor>({l.get(k)}));
      } else if (v.isList() && list_length(v) == n) {  // a Scalar list: one value per element
        c10::impl::GenericList single(v.toList().elementType());
        single.push_back(v.toListRef()[k]);
        one.emplace_back(std::move(single));
      } else {
        one.push_back(v);
      }
    }
    op.callBoxed(&one);
    if (returns.empty()) returns.resize(one.size());
    for (size_t r = 0; r < one.size() && r < returns.size(); ++r)
      if (one[r].isTensorList())
        for (const at::Tensor& t : one[r].toTensorList()) returns[r].push_back(t);
  }
  torch::jit::drop(*stack, num_args);
  for (auto& l : returns) stack->emplace_back(std::move(l));
}

}  // namespace tpu::backend
