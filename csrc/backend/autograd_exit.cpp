// Why: PyTorch's engine keeps each backward's state (with the caller's thread-local Python
// objects: PyTorch 2.13 stashes a contextvars context there) until the device thread that
// finished it leaves its loop iteration. The caller may see the backward done, return and
// exit first. A device thread that then drops the last reference takes the GIL while Python
// finalizes, Python ends that thread with pthread_exit, the unwind meets a noexcept
// destructor, and the process aborts ("terminate called without an active exception").
// A device thread runs its tasks in order, so one more backward through each tpu device's
// thread, with no Python object in its state, finishes only after the earlier state is gone.
#include "backend/autograd_exit.h"

#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "backend/device.h"
#include "runtime/client.h"

namespace tpu::backend {

namespace {

// One backward of a view of an empty tensor on each device: no device program runs.
void pass_through_each_device_thread() {
  for (int i = 0; i < device_count(); ++i) {
    auto opts = at::TensorOptions().device(c10::Device(c10::DeviceType::PrivateUse1, i));
    at::Tensor x = at::empty({0}, opts).requires_grad_(true);
    at::Tensor y = x.view({0});
    torch::autograd::grad({y}, {x}, {at::empty({0}, opts)});
  }
}

}  // namespace

void settle_autograd_threads() {
  if (!runtime::Client::initialized() || runtime::Client::forked_after_init()) return;
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();
  // On a fresh thread: its thread-locals hold no Python object for the engine to capture,
  // and a device thread stuck in a user's hung collective cannot hold the exit forever.
  std::thread([done] {
    try {
      pass_through_each_device_thread();
    } catch (...) {
    }
    std::lock_guard<std::mutex> lock(done->mu);
    done->done = true;
    done->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(done->mu);
  done->cv.wait_for(lock, std::chrono::seconds(5), [&] { return done->done; });
}

}  // namespace tpu::backend
