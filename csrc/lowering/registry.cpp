#include "lowering/registry.h"

#include <map>

namespace tpu::lowering {
namespace {
std::map<std::string, Rule>& table() {
  static std::map<std::string, Rule> t;
  return t;
}
std::map<Rule, RuntimeArgs>& runtime_args_table() {
  static std::map<Rule, RuntimeArgs> t;
  return t;
}
}  // namespace

void register_runtime_args(Rule rule, const RuntimeArgs& args) { runtime_args_table()[rule] = args; }

const RuntimeArgs* find_runtime_args(Rule rule) {
  auto it = runtime_args_table().find(rule);
  return it == runtime_args_table().end() ? nullptr : &it->second;
}

void register_rule(const char* op, Rule rule) { table()[op] = rule; }

const Rule* find_rule(const std::string& op) {
  auto it = table().find(op);
  return it == table().end() ? nullptr : &it->second;
}

std::vector<std::string> overloads_of(const std::string& op) {
  std::vector<std::string> out;
  // Sorted names: `op`, then its "op.<overload>" ones, lie in one range from `op`.
  for (auto it = table().lower_bound(op); it != table().end(); ++it) {
    const std::string& k = it->first;
    if (k.compare(0, op.size(), op) != 0) break;
    if (k.size() == op.size() || k[op.size()] == '.') out.push_back(k);
  }
  return out;
}

std::vector<std::string> rule_names() {
  std::vector<std::string> out;
  for (auto& [k, v] : table()) out.push_back(k);
  return out;
}

}  // namespace tpu::lowering
