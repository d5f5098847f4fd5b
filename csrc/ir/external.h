// StableHLO modules made elsewhere (a JAX function exported with jax.export), spliced
// into our programs: their functions become private functions of our module, renamed
// so that two imports never clash, and the program calls the imported entry point.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/builder.h"

namespace tpu::ir {

struct ExternalModule {
  std::string what;       // who made it, for errors ("mylib::rmsnorm")
  std::string entry;      // the renamed `main`
  std::string functions;  // every func.func of the module, renamed and private
  std::vector<Type> params, results;
};

// Imports a module printed in MLIR's generic form (what `get_asm(print_generic_op_form=
// True)` prints: it parses the same in any MLIR version that knows the ops, unlike each
// dialect's pretty syntax). Every symbol gets `prefix` in front. `params`/`results` are
// the types the caller expects of `main`: a module whose `main` has others is refused.
// Only func.func may stand at the top level (throws std::invalid_argument otherwise).
ExternalModule import_module(const std::string& generic_text, const std::string& prefix,
                             const std::string& what, const std::vector<Type>& params,
                             const std::vector<Type>& results);

// A process-wide table of imported modules, so that a lowering rule can name one by
// a small integer (a compile-time argument of the op that calls it).
// Imports (as above, with a prefix of its own) and keeps the module; returns its id.
int64_t add_external_module(const std::string& generic_text, const std::string& what,
                            const std::vector<Type>& params, const std::vector<Type>& results);
const ExternalModule& external_module(int64_t id);  // throws std::out_of_range

}  // namespace tpu::ir
