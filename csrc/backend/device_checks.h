// Conditions programs compute about their inputs (indices in range), checked like CUDA's
// device-side asserts: the flag is a program output, read at the next synchronization
// (at once in Debug mode), so checking costs no host round trip per op.
#pragma once
#include <string>

#include "backend/deferred.h"

namespace tpu::backend {

// `ok` is a bool scalar computed by an op; `message` is raised if it is false.
void add_device_check(Operand ok, std::string message);
// Reads every outstanding flag; raises IndexError with the first failed one's message
// (RuntimeError when the message starts with "RuntimeError: "). Inside a LaunchNow scope
// (a read of values the pending graph does not compute) flags still pending stay for
// the read that runs their graph: reading them would run it.
void verify_device_checks();

}  // namespace tpu::backend
