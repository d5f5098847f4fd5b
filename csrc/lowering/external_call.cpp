// Calls of imported StableHLO modules (JAX functions, ir/external.h): the op's only
// compile-time argument names the module; its functions join the program and the
// program calls its entry point on the operands.
#include "ir/external.h"
#include "lowering/registry.h"

namespace tpu::lowering {

// torch_tpu::call_stablehlo(Tensor[] inputs, int module) -> Tensor[]
TPU_LOWER(call_stablehlo, "call_stablehlo") {
  const ir::ExternalModule& m = ir::external_module(ctx.i(1));
  std::vector<Value> ins = ctx.list(0);
  if (ins.size() != m.params.size())
    throw std::invalid_argument(m.what + ": expected " + std::to_string(m.params.size()) +
                                " tensor arguments, got " + std::to_string(ins.size()));
  for (size_t i = 0; i < ins.size(); ++i)
    if (ins[i].type.str() != m.params[i].str())
      throw std::invalid_argument(m.what + ": tensor argument " + std::to_string(i) + " is " +
                                  ins[i].type.str() + " but the exported function takes " +
                                  m.params[i].str());
  ctx.b.add_functions(m.entry, m.functions);
  return ctx.b.call(m.entry, ins, m.results);
}

}  // namespace tpu::lowering
