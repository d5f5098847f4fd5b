// In-place writes outside DeferAndFuse: the program that rewrites a storage takes the
// storage's old buffer as a donated input, aliased to the new value, so an in-place op
// (x.add_(1), x[5] = 7, an optimizer's update) needs one buffer of the storage, not two,
// as CUDA's in-place kernels do. Fused graphs donate by the same rule (deferred.cpp).
#pragma once
#include <cstddef>
#include <exception>
#include <vector>

#include <ATen/Tensor.h>

#include "backend/deferred.h"

namespace tpu::backend {

struct StorageData;

// A storage an eager program rewrites whole: parameter `param` is its value now, result
// `result` its next value.
struct StorageRewrite {
  int param;
  int result;
  StorageData* storage;
};

// Whether eager in-place writes donate (donation_allowed(), read cheaply per op call).
bool eager_donation();

// `program`'s executable with parameter i aliased to result aliases[i] (-1: not), for a
// launch donating those parameters; null where the program is not wrapped (an imported
// module, whose attributes the wrapper would drop).
runtime::ExecutablePtr aliased_executable_of(const Program& program, const std::vector<int>& aliases);

// Whether a buffer is large enough to donate (smaller ones save little, and on the XLA CPU
// plugin a donated launch waits for the one before it).
bool worth_donating(const runtime::Buffer& b);

// Runs `program` as run() does in Strict and Debug, donating the old buffer of each
// rewrite that nothing else holds (no other storage, queued launch, pending check or
// operand of this call). *donated says whether one was. A launch that fails once it took
// a donated buffer leaves that storage unreadable, naming the error (its old value is gone).
Results run_rewriting(const ProgramPtr& program, Operands args, int device,
                      const StorageRewrite* rewrites, size_t count, bool* donated);

// A launch about to overwrite whole storages it does not read (x.normal_(), a cast copy_):
// the old buffers of those nothing else holds are dropped before it, so it needs one
// buffer of each, not two, donation or not. `need` is what the launch allocates. Nothing
// is dropped unless the launch then fits the limit (otherwise its own out-of-memory error
// leaves the storages as they were). Returns the storages dropped: they read as
// unreadable until the caller sets their new values (finish_overwrite), or stay so,
// naming the error, when the launch fails (fail_overwrite).
std::vector<StorageData*> drop_overwritten(const std::vector<StorageData*>& storages, int device, int64_t need);
void finish_overwrite(const std::vector<StorageData*>& dropped);
void fail_overwrite(const std::vector<StorageData*>& dropped, const std::exception& e);

// copy_ of the contiguous host tensor `host` (already of `dtype`, the destination's device
// dtype) into `dst`, where it becomes dst's whole storage value as it is: the old value is
// not needed, so where nothing else holds its buffer the buffer is dropped before the
// upload (in every mode, donation or not): one buffer of the storage, not two, as CUDA's
// copy_ writes in place (a checkpoint loaded into a full device). The limit is checked
// first as if it were freed, so a copy that cannot fit raises with dst unchanged; an upload
// failing once it was dropped leaves the storage unreadable, naming the error.
// False (nothing done) where that does not apply: the caller copies as before.
bool upload_replacing(const at::Tensor& dst, const at::Tensor& host, DType dtype);

}  // namespace tpu::backend
