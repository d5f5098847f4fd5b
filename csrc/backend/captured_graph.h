// Compiled mode's steady calls. A compiled graph's first call records its ops and
// flushes them as one program; a capture watches that call and notes how the program's
// inputs and outputs relate to the graph's: which graph input each program parameter
// reads, which parameters are constants or fresh random states, which results become
// the graph's outputs (their sizes and strides), which results are written back into
// inputs (AOTAutograd's copy_ epilogue). Later calls whose inputs look the same (dtype,
// sizes, strides, storage layout) launch the cached program on the new inputs' buffers
// without recording anything. Whatever the capture cannot explain makes it decline, and
// those calls keep recording.
#pragma once
#include <optional>
#include <string>

#include <ATen/core/Generator.h>

#include "backend/deferred.h"

namespace tpu::backend {

// How an op's host-made input (not a storage's value) came to be, reported while
// recording so a capture knows whether a later call may reuse it.
enum class HostInput {
  Constant,  // a value fixed by the op's arguments (a Python scalar of the graph)
  Rng,       // a fresh state of the device's default generator
  Varying,   // anything else (a CPU tensor's value, an explicit generator)
};
void note_host_input(const runtime::BufferPtr& b, HostInput kind);
// Whether the active capture knows `cpu` (0-D) as made from a Python number while it
// records, unchanged since, or it is read inside an ATen op call whose only host values
// are Python numbers of the graph (compile.py's number scope): its value is then a
// constant of the graph.
bool noted_constant(const at::Tensor& cpu);
// A device value read on the host while recording (`.item()` of an input): what the graph
// did with it (a size, a constant) is baked into the program, so the capture declines.
void note_host_read();
// A device check (a flag read later that raises `message`) on a recorded result.
void note_device_check(const Operand& ok, const std::string& message);

// The state buffer for the next random op on `gen` (lowered_kernel.cpp).
runtime::BufferPtr rng_state_buffer(const std::optional<at::Generator>& gen, int device);

// torch.set_float32_matmul_precision as the precision of f32 matmuls and convolutions
// (lowered_kernel.cpp): "highest" keeps f32, "high" three bf16 passes, "medium" one.
ir::DotPrecision torch_matmul_precision();

}  // namespace tpu::backend
