// XLA compile time as another process can read it while a compile runs. A tool that
// runs jobs under a deadline (the conformance tool's worker pool) must not count
// compiling against a job, but a compile is one blocking call: the job cannot report
// it until it returns. With TPU_COMPILE_CLOCK_FILE set, every compile's start and end
// are written to that file as three little-endian int64s -- microseconds of finished
// compiles, compiles in flight, and the sum of their CLOCK_MONOTONIC start times in
// microseconds -- so the reader's compile time at `now` is
// done + in_flight * now - start_sum.
#pragma once
#include <cstdint>

namespace tpu::runtime {

class CompileClock {
 public:
  // The process's clock: writes only when TPU_COMPILE_CLOCK_FILE names a file.
  static CompileClock& get();
  int64_t start();            // returns the start time to pass to finish
  void finish(int64_t start_us);
  // One compile, for the scope of this object (a failed one included).
  struct Span {
    Span() : start_us(get().start()) {}
    ~Span() { get().finish(start_us); }
    int64_t start_us;
  };

 private:
  CompileClock();
  void write_locked();
  int fd_ = -1;
  int64_t done_us_ = 0, in_flight_ = 0, start_sum_us_ = 0;
};

}  // namespace tpu::runtime
