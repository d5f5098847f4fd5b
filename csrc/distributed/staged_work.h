// The Work of a host-staged collective: the host transport's own Work(s), then the
// results written back into the tpu tensors. The write-back runs on whichever thread
// finishes the transport's last Work (a callback on its future: Gloo's worker thread),
// so a synchronous collective costs no thread handoff beyond Gloo's own, async_op=True
// returns at once, and a future completes without anyone calling wait(). Transport
// Works without a future (Gloo's send/recv) are waited for by a helper thread.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
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

// Writes a collective's result `value` into the tpu tensor `dst` as NCCL's raw writes do:
// whatever dst's autograd state (a pipeline stage receives into leaves that require grad),
// inference tensors too, and without bumping autograd's version counter. c10d's in-place
// collectives carry no alias annotation, so on NCCL and Gloo `y = tanh(w); all_reduce(y)`
// leaves y's version as it was and backward runs, with the reduced y.
void write_result(const at::Tensor& dst, const at::Tensor& value);

// NCCL's all_gather into a list of pieces of one shape gathers into a flat tensor and
// copy_s each piece out of it at the call (ProcessGroupNCCL::allgather): each piece's
// version goes up once. Pieces of different shapes it receives directly: no change.
// The same here, where the results themselves are written by write_result.
void bump_versions_as_nccls_all_gather(const std::vector<at::Tensor>& outputs);

class Sequencer;

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
  // The storages (StorageImpl addresses) the collective reads or writes until it completes.
  void set_touched(std::vector<const void*> storages) { touched_ = std::move(storages); }
  bool touches(const void* storage) const;
  // Waits until it completed, its error (if any) left to its own wait().
  void wait_completed();

 private:
  friend class Sequencer;
  // One transport Work finished (with `err`, or none); true when it was the last.
  bool transport_done(std::exception_ptr err);
  bool transport_finished() const { return remaining_.load() == 0; }
  // The write-backs (called in issue order, one Work at a time).
  void write_results();
  // Then the Work and its future complete. Outside the sequencer's lock and after the
  // Work left its queue: a future callback may issue and wait on another collective
  // (DDP's PowerSGD hook does), which completes through the same queue.
  void publish();

  std::string what_;  // the collective, for errors
  std::vector<c10::intrusive_ptr<c10d::Work>> inner_;
  std::vector<WriteBack> writes_;
  std::function<void()> before_writes_;  // e.g. AVG's division, on host tensors
  std::vector<at::Tensor> results_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<int> remaining_;  // transport Works not finished
  std::exception_ptr transport_error_;  // set before remaining_ reaches 0
  int source_rank_ = -1;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::vector<const void*> touched_;
};

// Completes StagedWorks in the order they were issued (two collectives may write the
// same tensor), on the threads that finish their transports.
class Sequencer : public std::enable_shared_from_this<Sequencer> {
 public:
  Sequencer();
  ~Sequencer();  // stops the helper thread (after what it waits for)
  void enqueue(const c10::intrusive_ptr<StagedWork>& work);
  // Collectives on one group run in issue order on NCCL (one stream): a collective issued
  // while an earlier one that reads or writes the same storage has not finished sees its
  // result. The later one waits for the last such Work before it reads or writes `storage`.
  void wait_for_earlier(const void* storage);
  // Waits until every enqueued Work completed and no transport thread is still inside
  // this sequencer (dropping references, running future callbacks).
  void drain_all();
  // What drain_all() runs its wait inside. python.cpp installs one that lets go of the
  // GIL when the caller holds it (Python dropping the last reference to a backend):
  // completing a Work can free a tensor whose Python object needs the GIL.
  using WaitScope = void (*)(const std::function<void()>& wait);
  static void set_wait_scope(WaitScope scope);
  // drain_all() on every live sequencer. Called before the interpreter finalizes: a
  // transport thread that then dropped the last reference to a tensor with a Python
  // object (or ran a Python callback) would take the GIL and be torn down mid-C++ frame.
  static void drain_every();

 private:
  void on_transport_done(StagedWork* w, std::exception_ptr err);
  void complete_ready();  // completes the finished Works at the head of the queue
  void helper_loop();

  std::mutex run_mu_;  // one thread writes back at a time
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<StagedWork>> queue_;
  // Transport Works without a future, for the helper thread to wait on.
  // The StagedWork by plain pointer, as in the future callbacks (the queue keeps it alive).
  std::deque<std::pair<c10::intrusive_ptr<c10d::Work>, StagedWork*>> unwatched_;
  bool stop_ = false;
  int active_ = 0;  // threads inside on_transport_done or publishing (under mu_)
  std::thread helper_;
};

}  // namespace tpu::distributed
