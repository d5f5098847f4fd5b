#include "runtime/compile_clock.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

namespace tpu::runtime {
namespace {

std::mutex g_mu;

int64_t monotonic_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

}  // namespace

CompileClock& CompileClock::get() {
  static CompileClock* clock = new CompileClock();  // never destroyed: compiles may outlive exit
  return *clock;
}

CompileClock::CompileClock() {
  const char* path = std::getenv("TPU_COMPILE_CLOCK_FILE");
  if (path && *path) fd_ = ::open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
}

int64_t CompileClock::start() {
  int64_t now = monotonic_us();
  if (fd_ < 0) return now;
  std::lock_guard<std::mutex> lock(g_mu);
  in_flight_ += 1;
  start_sum_us_ += now;
  write_locked();
  return now;
}

void CompileClock::finish(int64_t start_us) {
  if (fd_ < 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  in_flight_ -= 1;
  start_sum_us_ -= start_us;
  done_us_ += monotonic_us() - start_us;
  write_locked();
}

void CompileClock::write_locked() {
  int64_t v[3] = {done_us_, in_flight_, start_sum_us_};  // x86-64 and aarch64: little-endian
  (void)!::pwrite(fd_, v, sizeof v, 0);
}

}  // namespace tpu::runtime
