#include "distributed/staged_work.h"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <pthread.h>

#include <algorithm>
#include <optional>
#include <set>

#include "backend/dtypes.h"
#include "backend/storage.h"
#include "runtime/client.h"

namespace tpu::distributed {

void write_result(const at::Tensor& dst, const at::Tensor& value) {
  // Below ADInplaceOrView: no autograd record, no version bump (a view shares its base's
  // counter, which stays as it was too).
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  // An inference tensor takes the values whatever mode this thread is in (a transport
  // thread, or a caller outside torch.inference_mode()).
  std::optional<c10::InferenceMode> inference;
  if (dst.is_inference()) inference.emplace();
  dst.copy_(value);
}

void bump_versions_as_nccls_all_gather(const std::vector<at::Tensor>& outputs) {
  for (const at::Tensor& o : outputs)
    if (o.sizes() != outputs[0].sizes()) return;
  for (const at::Tensor& o : outputs)
    if (!o.is_inference()) o.unsafeGetTensorImpl()->bump_version();
}

namespace {

// Puts the host result into the tpu tensor. When the result fills the tensor's whole
// storage, the device buffer is made over the host memory itself where the plugin can
// alias it (host-memory devices): no copy, no fresh device allocation.
void write_back(const WriteBack& w) {
  const at::Tensor& d = w.device;
  const at::Tensor& h = w.host;
  bool whole = d.numel() > 0 && d.is_contiguous() && d.storage_offset() == 0 &&
               d.nbytes() == d.storage().nbytes() && !d.is_conj() && !d.is_neg() &&
               h.is_contiguous() && h.scalar_type() == d.scalar_type() && h.sizes() == d.sizes();
  if (!whole) {
    write_result(d, h);
    return;
  }
  int device = backend::device_index(d);
  DType st = backend::device_dtype(h.scalar_type(), "copy_");
  std::vector<int64_t> dims(h.sizes().begin(), h.sizes().end());
  // An `empty` output's bytes: the upload is its first buffer, counted once.
  backend::FillingUnwritten filling(backend::storage_data(d));
  // The release holds the host tensor (and so its pool block) while the buffer needs it.
  auto buf = runtime::Client::get().from_host_borrowed(h.data_ptr(), st, dims, device,
                                                       [keep = h] {});
  write_result(d, backend::wrap_value(backend::Operand(buf), h.scalar_type(), h.sizes(), device));
}

}  // namespace

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
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors())),
      remaining_(static_cast<int>(inner_.size())) {}

bool StagedWork::transport_done(std::exception_ptr err) {
  if (err) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!transport_error_) transport_error_ = err;
  }
  return remaining_.fetch_sub(1) == 1;
}

void StagedWork::write_results() {
  std::exception_ptr err;
  try {
    if (transport_error_) std::rethrow_exception(transport_error_);
    if (retrieveOpType() == c10d::OpType::RECVANYSOURCE && inner_.size() == 1)
      source_rank_ = inner_[0]->sourceRank();
    if (before_writes_) before_writes_();
    for (auto& w : writes_) write_back(w);
  } catch (const std::exception& e) {
    try {
      TORCH_CHECK_WITH(DistBackendError, false, "tpu_dist ", what_, " failed: ", e.what());
    } catch (...) {
      err = std::current_exception();
    }
  }
  // Host copies and the transport's Works (which hold them) are no longer needed:
  // their memory goes back to the staging pool.
  writes_.clear();
  before_writes_ = nullptr;
  std::vector<c10::intrusive_ptr<c10d::Work>> inner;
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = err;
    inner.swap(inner_);
  }
  inner.clear();
}

void StagedWork::publish() {
  std::exception_ptr err = exception();
  // The future first: a caller woken by wait() may read it at once.
  if (err)
    future_->setError(err);
  else
    future_->markCompleted(c10::IValue(results_));
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
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
  std::lock_guard<std::mutex> lock(mu_);
  if (done_ && source_rank_ >= 0) return source_rank_;
  TORCH_CHECK(inner_.size() == 1, "tpu_dist ", what_, ": sourceRank() is only for recv");
  return inner_[0]->sourceRank();
}

bool StagedWork::touches(const void* storage) const {
  return std::find(touched_.begin(), touched_.end(), storage) != touched_.end();
}

void StagedWork::wait_completed() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
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

namespace {
std::mutex g_live_mu;
std::set<Sequencer*>& live_sequencers() {
  static auto* s = new std::set<Sequencer*>();  // never destroyed: used at exit
  return *s;
}
}  // namespace

Sequencer::Sequencer() {
  std::lock_guard<std::mutex> lock(g_live_mu);
  live_sequencers().insert(this);
}

void Sequencer::drain_every() {
  std::lock_guard<std::mutex> lock(g_live_mu);  // keeps each alive while it drains
  for (Sequencer* s : live_sequencers()) s->drain_all();
}

Sequencer::~Sequencer() {
  {
    std::lock_guard<std::mutex> lock(g_live_mu);
    live_sequencers().erase(this);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (helper_.joinable()) helper_.join();
}

void Sequencer::enqueue(const c10::intrusive_ptr<StagedWork>& work) {
  std::vector<c10::intrusive_ptr<c10d::Work>> inner = work->inner_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(work);
  }
  if (inner.empty()) {
    complete_ready();
    return;
  }
  std::weak_ptr<Sequencer> self = weak_from_this();
  for (auto& w : inner) {
    c10::intrusive_ptr<c10::ivalue::Future> fut;
    try {
      fut = w->getFuture();
    } catch (const std::exception&) {  // Gloo's send/recv Works have none
    }
    if (!fut) {
      std::lock_guard<std::mutex> lock(mu_);
      unwatched_.emplace_back(w, work.get());
      if (!helper_.joinable()) helper_ = std::thread([this] { helper_loop(); });
      cv_.notify_all();
      continue;
    }
    // Runs on the thread that finishes the transport Work (or here, if it already has).
    // It holds the Work by a plain pointer: the queue keeps it alive until every transport
    // Work counted itself done, and a strong reference here could be the last one, dropped
    // on the transport's thread after drain_all() no longer watches.
    StagedWork* raw = work.get();
    fut->addCallback([self, raw](c10::ivalue::Future& f) {
      auto s = self.lock();
      std::exception_ptr err = f.hasError() ? f.exception_ptr() : nullptr;
      if (s) s->on_transport_done(raw, err);
    });
  }
}

void Sequencer::wait_for_earlier(const void* storage) {
  c10::intrusive_ptr<StagedWork> last;  // Works complete in order: the last one suffices
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = queue_.rbegin(); it != queue_.rend(); ++it)
      if ((*it)->touches(storage)) {
        last = *it;
        break;
      }
  }
  if (last) last->wait_completed();
}

void Sequencer::on_transport_done(StagedWork* w, std::exception_ptr err) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++active_;
  }
  if (w->transport_done(err)) complete_ready();
  {
    std::lock_guard<std::mutex> lock(mu_);
    --active_;
  }
  cv_.notify_all();
}

void Sequencer::complete_ready() {
  std::vector<c10::intrusive_ptr<StagedWork>> written;
  {
    std::lock_guard<std::mutex> run(run_mu_);
    for (;;) {
      c10::intrusive_ptr<StagedWork> w;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (queue_.empty() || !queue_.front()->transport_finished()) break;
        w = queue_.front();
      }
      w->write_results();
      {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.pop_front();
        ++active_;  // publishing: drain_all() waits for it
      }
      written.push_back(std::move(w));
    }
  }
  for (auto& w : written) {
    w->publish();
    w.reset();  // before drain_all() can return
    {
      std::lock_guard<std::mutex> lock(mu_);
      --active_;
    }
    cv_.notify_all();
  }
}

namespace {
std::atomic<Sequencer::WaitScope> g_wait_scope{nullptr};
}  // namespace

void Sequencer::set_wait_scope(WaitScope scope) { g_wait_scope.store(scope); }

void Sequencer::drain_all() {
  auto wait = [this] {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && active_ == 0; });
  };
  if (WaitScope scope = g_wait_scope.load()) scope(wait);
  else wait();
}

void Sequencer::helper_loop() {
  pthread_setname_np(pthread_self(), "tpu-dist-wait");  // for profilers and top -H
  for (;;) {
    std::pair<c10::intrusive_ptr<c10d::Work>, StagedWork*> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !unwatched_.empty(); });
      if (unwatched_.empty()) return;
      item = std::move(unwatched_.front());
      unwatched_.pop_front();
    }
    std::exception_ptr err;
    try {
      item.first->wait();
    } catch (...) {
      err = std::current_exception();
    }
    item.first.reset();
    on_transport_done(item.second, err);
  }
}

}  // namespace tpu::distributed
