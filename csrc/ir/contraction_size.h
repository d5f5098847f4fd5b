// How big a program's contractions are, read from its StableHLO text: the runtime picks
// per-program compile options by it (on the XLA CPU plugin, whether matmuls and
// convolutions spread over threads: a tiny one loses more to the hand-off than it gains).
#pragma once
#include <cstdint>
#include <string>

namespace tpu::ir {

// Multiply-adds of the program's largest dot_general or convolution; 0 when it has none;
// -1 when one's size cannot be read (text in a form our builder does not emit, such as an
// external kernel's), so a caller treats the program as large.
int64_t largest_contraction_macs(const std::string& text);

// Elements of the largest tensor type anywhere in the program (arguments, results and
// intermediates); -1 when one cannot be read (a dynamic dim), so a caller treats the
// program as large.
int64_t largest_tensor_elements(const std::string& text);

// Whether any tensor of the program has a float8 element type (f8E4M3FN, f8E5M2, ...).
bool uses_float8(const std::string& text);

}  // namespace tpu::ir
