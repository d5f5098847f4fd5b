// Reads the generic form Builder::raw writes: `%v = "op"(%a, %b) {attrs} : (lhs, rhs) -> out`.
#include "ir/contraction_size.h"

#include <algorithm>
#include <cctype>
#include <vector>

namespace tpu::ir {
namespace {

using Dims = std::vector<int64_t>;

// "tensor<4x64x16xf32>" at `pos` -> {4, 64, 16}; false on a dynamic or unreadable type.
bool read_tensor(const std::string& s, size_t& pos, Dims& dims) {
  static const std::string kTensor = "tensor<";
  if (s.compare(pos, kTensor.size(), kTensor) != 0) return false;
  pos += kTensor.size();
  dims.clear();
  while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) {
    int64_t d = 0;
    while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) d = d * 10 + (s[pos++] - '0');
    if (pos >= s.size() || s[pos] != 'x') return false;
    ++pos;
    dims.push_back(d);
  }
  size_t close = s.find('>', pos);
  if (close == std::string::npos || s[pos] == '?') return false;
  pos = close + 1;
  return true;
}

// The operand and result types after " : (" on one line.
bool read_signature(const std::string& line, std::vector<Dims>& operands, Dims& result) {
  size_t pos = line.rfind(" : (");
  if (pos == std::string::npos) return false;
  pos += 4;
  operands.clear();
  while (true) {
    Dims d;
    if (!read_tensor(line, pos, d)) return false;
    operands.push_back(d);
    if (line.compare(pos, 2, ", ") == 0) {
      pos += 2;
      continue;
    }
    break;
  }
  static const std::string kArrow = ") -> ";
  if (line.compare(pos, kArrow.size(), kArrow) != 0) return false;
  pos += kArrow.size();
  return read_tensor(line, pos, result);
}

int64_t product(const Dims& d) {
  int64_t p = 1;
  for (int64_t x : d) p *= x;
  return p;
}

// "name = [2, 3]" -> {2, 3}.
bool read_int_list(const std::string& line, const std::string& name, Dims& out) {
  size_t pos = line.find(name + " = [");
  if (pos == std::string::npos) return false;
  pos += name.size() + 4;
  out.clear();
  while (pos < line.size() && line[pos] != ']') {
    if (std::isdigit(static_cast<unsigned char>(line[pos]))) {
      int64_t v = 0;
      while (pos < line.size() && std::isdigit(static_cast<unsigned char>(line[pos]))) v = v * 10 + (line[pos++] - '0');
      out.push_back(v);
    } else {
      ++pos;
    }
  }
  return pos < line.size();
}

// Each output element of a dot sums over the lhs's contracting dims.
int64_t dot_macs(const std::string& line) {
  std::vector<Dims> in;
  Dims out, contract;
  if (!read_signature(line, in, out) || in.size() != 2 || !read_int_list(line, "lhs_contracting_dimensions", contract))
    return -1;
  int64_t k = 1;
  for (int64_t c : contract) {
    if (c < 0 || c >= static_cast<int64_t>(in[0].size())) return -1;
    k *= in[0][c];
  }
  return product(out) * k;
}

// Each output element of a convolution sums over the kernel's input features and window:
// the kernel's size over its output-feature extent ("o" in the rhs dimension numbers).
int64_t conv_macs(const std::string& line) {
  std::vector<Dims> in;
  Dims out;
  if (!read_signature(line, in, out) || in.size() != 2) return -1;
  size_t pos = line.find("#stablehlo.conv<");
  if (pos == std::string::npos) return -1;
  size_t rhs = line.find("]x[", pos);
  if (rhs == std::string::npos) return -1;
  size_t end = line.find(']', rhs + 3);
  std::string spec = line.substr(rhs + 3, end - rhs - 3);  // "o, i, 0, 1"
  int64_t index = 0, o = -1;
  for (size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] == ',') ++index;
    if (spec[i] == 'o') o = index;
  }
  if (o < 0 || o >= static_cast<int64_t>(in[1].size()) || in[1][o] == 0) return 0;
  return product(out) * (product(in[1]) / in[1][o]);
}

}  // namespace

int64_t largest_contraction_macs(const std::string& text) {
  int64_t largest = 0;
  size_t pos = 0;
  while ((pos = text.find("stablehlo.", pos)) != std::string::npos) {
    size_t name = pos + 10;
    pos = name;
    bool attribute = name >= 11 && text[name - 11] == '#';  // #stablehlo.dot<...>: not an op
    bool dot = text.compare(name, 3, "dot") == 0, conv = text.compare(name, 11, "convolution") == 0;
    if (attribute || (!dot && !conv)) continue;
    size_t line_start = text.rfind('\n', pos);
    line_start = line_start == std::string::npos ? 0 : line_start + 1;
    size_t line_end = text.find('\n', pos);
    std::string line = text.substr(line_start, line_end == std::string::npos ? std::string::npos : line_end - line_start);
    // Only the generic form we emit is read; anything else counts as large.
    bool generic_dot = text.compare(name, 13, "dot_general\"(") == 0;
    bool generic_conv = text.compare(name, 13, "convolution\"(") == 0;
    if (name < 11 || text[name - 11] != '"' || !(generic_dot || generic_conv)) return -1;
    int64_t macs = generic_dot ? dot_macs(line) : conv_macs(line);
    if (macs < 0) return -1;
    largest = std::max(largest, macs);
    if (line_end == std::string::npos) break;
    pos = line_end;
  }
  return largest;
}

int64_t largest_tensor_elements(const std::string& text) {
  int64_t most = 0;
  Dims dims;
  for (size_t pos = text.find("tensor<"); pos != std::string::npos; pos = text.find("tensor<", pos)) {
    size_t at = pos;
    if (!read_tensor(text, at, dims)) return -1;
    most = std::max(most, product(dims));
    pos = at;
  }
  return most;
}

bool uses_float8(const std::string& text) { return text.find("f8E") != std::string::npos; }

}  // namespace tpu::ir
