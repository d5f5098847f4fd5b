#include "ir/fusion.h"

#include <cctype>
#include <unordered_map>

namespace tpu::ir {
namespace {

std::string joined_names(const std::vector<Value>& vs) {
  std::string s;
  for (size_t i = 0; i < vs.size(); ++i) s += (i ? ", " : "") + vs[i].name;
  return s;
}

std::string joined_types(const std::vector<Type>& ts) {
  std::string s;
  for (size_t i = 0; i < ts.size(); ++i) s += (i ? ", " : "") + ts[i].str();
  return s;
}

std::vector<Type> types_of(const std::vector<Value>& vs) {
  std::vector<Type> ts;
  for (const Value& v : vs) ts.push_back(v.type);
  return ts;
}

}  // namespace

Value FusedModule::param(const Type& t) {
  params_.push_back(t);
  return Value{"%arg" + std::to_string(params_.size() - 1), t};
}

std::vector<Value> FusedModule::call(const std::string& fn, const std::vector<Value>& args,
                                     const std::vector<Type>& results) {
  std::string name = "%c" + std::to_string(next_++);
  body_ += "    " + name + (results.size() > 1 ? ":" + std::to_string(results.size()) : "") +
           " = \"func.call\"(" + joined_names(args) + ") {callee = @" + fn + "} : (" +
           joined_types(types_of(args)) + ") -> (" + joined_types(results) + ")\n";
  std::vector<Value> out;
  for (size_t i = 0; i < results.size(); ++i)
    out.push_back(Value{results.size() > 1 ? name + "#" + std::to_string(i) : name, results[i]});
  return out;
}

Value FusedModule::after(const Value& x, const Value& dep) {
  std::string& fn = after_fns_[x.type.str() + "|" + dep.type.str()];
  if (fn.empty()) {
    fn = prefix_ + "after" + std::to_string(after_fns_.size());
    Builder b;
    Value px = b.param(x.type), pd = b.param(dep.type);
    functions_ += b.function(fn, {b.after(px, pd)}, false);
  }
  return call(fn, {x, dep}, {x.type})[0];
}

Value FusedModule::materialized(const Value& x) {
  std::string& fn = materialized_fns_[x.type.str()];
  if (fn.empty()) {
    fn = prefix_ + "materialized" + std::to_string(materialized_fns_.size());
    Builder b;
    Value px = b.param(x.type);
    functions_ += b.function(fn, {b.materialized(px)}, false);
  }
  return call(fn, {x}, {x.type})[0];
}

std::string FusedModule::finish(const std::vector<Value>& results,
                                const std::vector<int>& aliases) const {
  std::string m = "module @torch_tpu_fused {\n" + functions_ + "  func.func public @main(";
  for (size_t i = 0; i < params_.size(); ++i) {
    m += (i ? ", " : "") + std::string("%arg") + std::to_string(i) + ": " + params_[i].str();
    if (i < aliases.size() && aliases[i] >= 0)
      m += " {tf.aliasing_output = " + std::to_string(aliases[i]) + " : i32}";
  }
  m += ") -> (" + joined_types(types_of(results)) + ") {\n" + body_ + "    \"func.return\"(" +
       joined_names(results) + ") : (" + joined_types(types_of(results)) + ") -> ()\n  }\n}\n";
  return m;
}

std::string FusedModule::private_function(const std::string& name, const std::vector<Value>& results) const {
  std::string f = functions_ + "  func.func private @" + name + "(";
  for (size_t i = 0; i < params_.size(); ++i)
    f += (i ? ", " : "") + std::string("%arg") + std::to_string(i) + ": " + params_[i].str();
  f += ") -> (" + joined_types(types_of(results)) + ") {\n" + body_ + "    \"func.return\"(" +
       joined_names(results) + ") : (" + joined_types(types_of(results)) + ") -> ()\n  }\n";
  return f;
}

namespace {
bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }
}  // namespace

std::string canonical_symbols(const std::string& text, const std::string& stem, const std::string& renamed) {
  const std::string taken = "@" + renamed;
  for (size_t p = text.find(taken); p != std::string::npos; p = text.find(taken, p + 1))
    if (p + taken.size() < text.size() && is_digit(text[p + taken.size()])) return text;
  const std::string pattern = "@" + stem;
  std::unordered_map<std::string, std::string> names;  // old digits -> new name
  std::string out;
  out.reserve(text.size());
  size_t done = 0;
  for (size_t p = text.find(pattern); p != std::string::npos; p = text.find(pattern, done)) {
    size_t digits = p + pattern.size(), end = digits;
    while (end < text.size() && is_digit(text[end])) ++end;
    out.append(text, done, p - done);
    // `@p12(`, `@p12}` and the helper `@p12_after1` are the symbol p12; `@p12x` is another.
    bool symbol = end > digits && (end == text.size() || !std::isalnum(static_cast<unsigned char>(text[end])));
    if (symbol) {
      std::string fresh = renamed + std::to_string(names.size());
      out += "@" + names.try_emplace(text.substr(digits, end - digits), std::move(fresh)).first->second;
    } else {
      out.append(text, p, end - p);
    }
    done = end;
  }
  out.append(text, done, std::string::npos);
  return out;
}

}  // namespace tpu::ir
