// One module from many programs: each recorded op's program becomes a private function,
// and `main` calls them in recording order. XLA inlines the calls and fuses across them,
// so the text of an op's program is emitted once however often the graph uses it.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "ir/builder.h"

namespace tpu::ir {

class FusedModule {
 public:
  // `helper_prefix` names its helper functions (after): modules nested as functions of
  // another module need names of their own.
  explicit FusedModule(std::string helper_prefix = "") : prefix_(std::move(helper_prefix)) {}
  // `main`'s next parameter.
  Value param(const Type& t);
  // Adds a function made by Builder::function (private, uniquely named).
  void add_function(const std::string& text) { functions_ += text; }
  // Calls `fn` from main; returns its results.
  std::vector<Value> call(const std::string& fn, const std::vector<Value>& args,
                          const std::vector<Type>& results);
  // x read through Builder::after(x, dep), as a call of a helper function.
  Value after(const Value& x, const Value& dep);
  // x as Builder::materialized makes it, as a call of a helper function: XLA computes x
  // once instead of copying its producers into each reader's fusion.
  Value materialized(const Value& x);
  // The module text. `aliases[i]` >= 0 lets parameter i's buffer be reused for that
  // result (the caller donates the buffer at launch).
  std::string finish(const std::vector<Value>& results, const std::vector<int>& aliases) const;
  // The same body as a private function `name` (with the functions added before it):
  // a graph called as one function from another graph.
  std::string private_function(const std::string& name, const std::vector<Value>& results) const;

 private:
  std::string prefix_;
  std::vector<Type> params_;
  std::string functions_;
  std::string body_;
  std::map<std::string, std::string> after_fns_;  // by operand types
  std::map<std::string, std::string> materialized_fns_;  // by operand type
  int next_ = 0;
};

// `text` with the symbols `@<stem><digits>` (and helpers named after them, `_...`)
// renamed `@<renamed><k>`, k in order of first appearance. Programs' private functions
// are numbered by a process-wide counter, so one graph would otherwise read differently
// in every process and never be found in the disk cache again. The text is returned
// unchanged if it already holds a `@<renamed><digit>` symbol (the names could collide).
std::string canonical_symbols(const std::string& text, const std::string& stem, const std::string& renamed);

}  // namespace tpu::ir
