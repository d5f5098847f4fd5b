// Conditions programs compute about their inputs (indices in range), checked like CUDA's
// device-side asserts: the flag is a program output, read at the next synchronization
// (at once in Debug mode), so checking costs no host round trip per op.
#pragma once
#include <string>
#include <vector>

#include <c10/core/Storage.h>

#include "backend/deferred.h"

namespace tpu::backend {

// `ok` is a bool scalar computed by an op; `message` is raised if it is false. The
// op's `outputs` that still hold what it computed then become unreadable: their
// values are garbage, and every later read or use names the failed check.
void add_device_check(Operand ok, std::string message, const std::vector<c10::Storage>& outputs = {});
// Reads every outstanding flag; raises IndexError with the first failed one's message
// (RuntimeError when the message starts with "RuntimeError: "). Inside a LaunchNow scope
// (a read of values the pending graph does not compute) flags still pending stay for
// the read that runs their graph: reading them would run it. With a `device`, only
// that device's flags (a synchronize of one device, as CUDA's reports its own context's
// device-side asserts); the others stay for their device's sync or a later read.
void verify_device_checks(int device = -1);
// Forgets the outstanding checks whose flag is one of `oks` (a discarded recording's:
// their flags are never computed; its replay adds its own).
void forget_device_checks(const std::vector<const void*>& oks);

// Raises a failed check's message as the type its tag asks for: "RuntimeError: " and
// "LinAlgError: " (torch.linalg.LinAlgError, as CPU's LAPACK failures) prefixes, else
// IndexError.
[[noreturn]] void raise_check_message(const std::string& message);

}  // namespace tpu::backend
