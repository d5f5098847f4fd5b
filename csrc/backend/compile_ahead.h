// Compiles programs on background threads ahead of their launch: Strict mode hands a
// program it has not loaded yet here and goes on with the next op, so one-op programs of
// a cold first step compile in parallel, and beside the Python that issues them.
#pragma once
#include "backend/deferred.h"

namespace tpu::backend {

// Starts compiling `program` (Program::executable) on a pool thread. Errors are left for
// the launch, which compiles again and raises them there.
void compile_ahead(const ProgramPtr& program);

// TPU_COMPILE_THREADS: the pool's threads (default: the machine's cores, at most 4);
// 0 turns compiling ahead off (Strict then compiles on the calling thread).
int compile_threads();

}  // namespace tpu::backend
