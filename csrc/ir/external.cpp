#include "ir/external.h"

#include <cctype>
#include <deque>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

namespace tpu::ir {
namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

bool blank(const std::string& l) { return l.find_first_not_of(" \t\r") == std::string::npos; }

bool ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '.' || c == '-';
}

// The value of `name = "..."` in an op's attributes, or "" when absent.
std::string string_attr(const std::string& line, const std::string& name) {
  std::string key = name + " = \"";
  size_t at = line.find(key);
  if (at == std::string::npos) return "";
  size_t start = at + key.size(), end = line.find('"', start);
  return end == std::string::npos ? "" : line.substr(start, end - start);
}

// Every `@sym` / `@"sym"` naming one of `symbols` gets `prefix` in front.
std::string rename_refs(const std::string& line, const std::set<std::string>& symbols,
                        const std::string& prefix) {
  std::string out;
  for (size_t i = 0; i < line.size();) {
    if (line[i] != '@') {
      out += line[i++];
      continue;
    }
    bool quoted = i + 1 < line.size() && line[i + 1] == '"';
    size_t start = i + (quoted ? 2 : 1), end = start;
    if (quoted) {
      end = line.find('"', start);
      if (end == std::string::npos) end = line.size();
    } else {
      while (end < line.size() && ident_char(line[end])) ++end;
    }
    std::string sym = line.substr(start, end - start);
    if (symbols.count(sym)) sym = prefix + sym;
    out += quoted ? "@\"" + sym + "\"" : "@" + sym;
    i = quoted ? std::min(end + 1, line.size()) : end;
  }
  return out;
}

std::string types_str(const std::vector<Type>& ts) {
  std::string s;
  for (size_t i = 0; i < ts.size(); ++i) s += (i ? ", " : "") + ts[i].str();
  return s;
}

}  // namespace

ExternalModule import_module(const std::string& text, const std::string& prefix,
                             const std::string& what, const std::vector<Type>& params,
                             const std::vector<Type>& results) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument(what + ": cannot splice its StableHLO module: " + why);
  };
  std::vector<std::string> lines = split_lines(text);
  size_t first = 0, last = lines.size();
  while (first < lines.size() && blank(lines[first])) ++first;
  while (last > first && blank(lines[last - 1])) --last;
  if (first >= last || lines[first].find("\"builtin.module\"()") != 0 ||
      lines[first].back() != '{' || lines[last - 1].find("})") != 0)
    fail("expected one module in MLIR's generic form (\"builtin.module\"() ... ({ ... }))");

  // Top-level ops sit at an indent of two: each must be a function.
  std::set<std::string> symbols;
  for (size_t i = first + 1; i + 1 < last; ++i) {
    const std::string& l = lines[i];
    if (l.size() < 3 || l[0] != ' ' || l[1] != ' ' || l[2] == ' ' || l[2] == '^' || l[2] == '}') continue;
    if (l.find("\"func.func\"()") != 2) fail("a top-level op other than func.func: " + l.substr(0, 80));
    std::string name = string_attr(l, "sym_name");
    if (name.empty()) fail("a function without a name");
    symbols.insert(name);
  }
  if (!symbols.count("main")) fail("no function @main");

  ExternalModule m{what, prefix + "main", "", params, results};
  std::string sig = "(" + types_str(params) + ") -> ";
  std::string want = sig + (results.size() == 1 ? results[0].str() : "(" + types_str(results) + ")");
  std::string want_paren = sig + "(" + types_str(results) + ")";
  for (size_t i = first + 1; i + 1 < last; ++i) {
    std::string l = lines[i];
    bool top = l.find("  \"func.func\"()") == 0;
    if (top) {
      std::string name = string_attr(l, "sym_name");
      if (name == "main") {
        size_t ft = l.find("function_type = ");
        if (ft == std::string::npos) fail("@main has no function_type");
        std::string got = l.substr(ft + 16);
        if (got.compare(0, want.size() + 1, want + ",") != 0 &&
            got.compare(0, want_paren.size() + 1, want_paren + ",") != 0) {
          size_t cut = got.find(", sym_name");
          fail("its @main has type " + got.substr(0, cut) + ", expected " + want);
        }
      }
      l.replace(l.find("sym_name = \"" + name + "\""), 12 + name.size() + 1,
                "sym_name = \"" + prefix + name + "\"");
      size_t vis = l.find("sym_visibility = \"");
      if (vis != std::string::npos) {
        size_t end = l.find('"', vis + 18);
        l.replace(vis, end + 1 - vis, "sym_visibility = \"private\"");
      } else {
        size_t props = l.find("<{");
        if (props == std::string::npos) fail("a function without properties: " + l.substr(0, 80));
        l.insert(props + 2, "sym_visibility = \"private\", ");
      }
    }
    m.functions += rename_refs(l, symbols, prefix) + "\n";
  }
  return m;
}

namespace {
std::mutex g_mu;
std::deque<ExternalModule>& table() {  // a deque: references stay valid as it grows
  static std::deque<ExternalModule> t;
  return t;
}
}  // namespace

int64_t add_external_module(const std::string& text, const std::string& what,
                            const std::vector<Type>& params, const std::vector<Type>& results) {
  std::lock_guard<std::mutex> lock(g_mu);
  int64_t id = static_cast<int64_t>(table().size());
  table().push_back(import_module(text, "ext" + std::to_string(id) + "_", what, params, results));
  return id;
}

const ExternalModule& external_module(int64_t id) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (id < 0 || id >= static_cast<int64_t>(table().size()))
    throw std::out_of_range("no imported StableHLO module " + std::to_string(id));
  return table()[id];
}

}  // namespace tpu::ir
