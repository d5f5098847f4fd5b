#include "distributed/staged_work.h"

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

namespace tpu::distributed {

StagedWork::StagedWork(int rank, c10d::OpType op, std::string what,
                       std::vector<c10::intrusive_ptr<c10d::Work>> inner,
                       std::vector<WriteBack> writes, std::function<void()> before_writes,
                       std::vector<at::Tensor> results)
    : c10d::Work(rank, op),
      what_(std::move(what)),
      inner_(std::move(inner)),
      writes_(std::move(writes)),
      before_writes_(std::move(before_writes)),
      results_(std::move(results)),
      // A CPU future: its value holds tpu tensors, but no device events are needed
      // (the values are written before it completes).
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors())) {}

void StagedWork::complete() {
  std::exception_ptr err;
  try {
    for (auto& w : inner_) w->wait();
    if (before_writes_) before_writes_();
    // A collective writes into the tensors it was given, as NCCL does, whatever their
    // autograd state (a pipeline stage receives into leaves that require grad).
    at::NoGradGuard no_grad;
    for (auto& w : writes_) w.device.copy_(w.host);
  } catch (const std::exception& e) {
    try {
      TORCH_CHECK_WITH(DistBackendError, false, "tpu_dist ", what_, " failed: ", e.what());
    } catch (...) {
      err = std::current_exception();
    }
  }
  writes_.clear();  // host copies are no longer needed
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = err;
  }
  cv_.notify_all();
  if (err)
    future_->setError(err);
  else
    future_->markCompleted(c10::IValue(results_));
}

bool StagedWork::isCompleted() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool StagedWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && !error_;
}

std::exception_ptr StagedWork::exception() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

int StagedWork::sourceRank() const {
  // Only recv from any source asks; its single transport Work knows.
  TORCH_CHECK(inner_.size() == 1, "tpu_dist ", what_, ": sourceRank() is only for recv");
  return inner_[0]->sourceRank();
}

bool StagedWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout == kNoTimeout) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
    TORCH_CHECK_WITH(DistBackendError, false, "tpu_dist ", what_, " timed out after ",
                     timeout.count(), " ms");
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

Completer::Completer() : thread_([this] { loop(); }) {}

Completer::~Completer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Completer::enqueue(c10::intrusive_ptr<StagedWork> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(work));
  }
  cv_.notify_one();
}

void Completer::loop() {
  for (;;) {
    c10::intrusive_ptr<StagedWork> w;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      w = std::move(queue_.front());
      queue_.pop_front();
    }
    w->complete();
  }
}

}  // namespace tpu::distributed
