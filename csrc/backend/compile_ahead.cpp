#include "backend/compile_ahead.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include <pthread.h>

namespace tpu::backend {

int compile_threads() {
  static const int n = [] {
    if (const char* s = std::getenv("TPU_COMPILE_THREADS"); s && *s) return std::max(0, std::atoi(s));
    return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  }();
  return n;
}

namespace {

class CompilePool {
 public:
  void add(ProgramPtr p) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (started_ < compile_threads()) {
        std::thread([this] { loop(); }).detach();  // lives as long as the process
        ++started_;
      }
      queue_.push_back(std::move(p));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    pthread_setname_np(pthread_self(), "tpu-compile");  // for profilers and top -H
    for (;;) {
      ProgramPtr p;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        p = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        p->executable();  // holds it while loaded: the launch finds it
      } catch (...) {
        // the launch compiles again and raises it where the op's error belongs
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ProgramPtr> queue_;
  int started_ = 0;
};

CompilePool& pool() {
  static CompilePool* p = new CompilePool();  // never destroyed: its threads may outlive statics
  return *p;
}

}  // namespace

void compile_ahead(const ProgramPtr& program) { pool().add(program); }

}  // namespace tpu::backend
