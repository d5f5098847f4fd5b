// The Work of a host-staged collective: the host transport's own Work(s), then the
// results copied back into the tpu tensors. A per-backend completion thread does the
// waiting and the copies, so async_op=True returns at once and a future completes
// without anyone calling wait().
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace tpu::distributed {

// A host tensor whose values belong in a tpu tensor once the collective is done.
struct WriteBack {
  at::Tensor device;
  at::Tensor host;
};

class StagedWork : public c10d::Work {
 public:
  StagedWork(int rank, c10d::OpType op, std::string what,
             std::vector<c10::intrusive_ptr<c10d::Work>> inner, std::vector<WriteBack> writes,
             std::function<void()> before_writes, std::vector<at::Tensor> results);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override { return results_; }
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Runs on the completion thread: waits for the transport, then writes back.
  void complete();

 private:
  std::string what_;  // the collective, for errors
  std::vector<c10::intrusive_ptr<c10d::Work>> inner_;
  std::vector<WriteBack> writes_;
  std::function<void()> before_writes_;  // e.g. AVG's division, on host tensors
  std::vector<at::Tensor> results_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// One thread finishing StagedWorks in the order they were issued.
class Completer {
 public:
  Completer();
  ~Completer();  // finishes what is queued, then stops
  void enqueue(c10::intrusive_ptr<StagedWork> work);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<StagedWork>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tpu::distributed
