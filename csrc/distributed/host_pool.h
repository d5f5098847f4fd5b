// Host memory for staging collectives, reused from one collective to the next. A fresh
// multi-MiB host tensor costs its page faults on first touch (more than the copy into it);
// collectives repeat the same sizes (DDP's buckets, a training loop's tensors), so blocks
// are kept and handed out again once nothing else holds them.
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

#include <ATen/Tensor.h>

namespace tpu::distributed {

class HostPool {
 public:
  // A contiguous host tensor of `sizes` and `dtype`, its contents undefined. Its memory
  // returns to the pool when the last tensor (or zero-copy device buffer) using it is gone.
  at::Tensor take(at::IntArrayRef sizes, at::ScalarType dtype);

 private:
  static constexpr int64_t kMinBytes = 64 << 10;    // below this malloc is cheap
  static constexpr int64_t kMaxBytes = 1ll << 30;   // kept blocks, in all
  std::mutex mu_;
  std::vector<at::Tensor> blocks_;  // flat uint8; free when the pool's is the only use
  int64_t bytes_ = 0;
};

}  // namespace tpu::distributed
