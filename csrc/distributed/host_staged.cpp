#include "distributed/host_staged.h"

#include <optional>

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/device_checks.h"
#include "distributed/checks.h"
#include "backend/storage.h"
#include "runtime/client.h"
#include "runtime/host_address.h"

namespace tpu::distributed {

using c10d::OpType;
using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;
using TensorList = std::vector<at::Tensor>;

namespace {
// Gloo's dtypes: others fail on its thread as "Invalid scalar type"; caught here instead,
// before anything is sent, with the collective's name.
void check_host_dtype(const char* what, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kComplexFloat: case at::kComplexDouble: case at::kChar: case at::kByte:
    case at::kInt: case at::kLong: case at::kBool:
      return;
    default:
      TORCH_CHECK_TYPE(false, "distributed.", what, "(): tpu_dist's host-staged transport "
                       "(Gloo) does not take ", describe(t), "; it takes float32, float64, "
                       "float16, bfloat16, complex64, complex128, int8, uint8, int32, int64 "
                       "and bool");
  }
}
// A CPU tensor over `t`'s values in device memory, where the plugin reports that its
// buffers live in host memory (runtime/host_address.h); it holds the device buffer.
// Read only. Undefined elsewhere, or with host addresses off: then values are copied.
at::Tensor host_view(const at::Tensor& t, bool host_addresses) {
  if (!host_addresses || t.numel() == 0 || t.is_conj() || t.is_neg()) return {};
  runtime::Client& c = runtime::Client::get();
  if (!runtime::buffers_in_host_memory(c, backend::device_index(t))) return {};
  backend::verify_device_checks();  // values read must not come from a failed op
  runtime::BufferPtr buf = backend::dense_buffer(t);  // pending work runs first
  if (buf->nbytes() != static_cast<int64_t>(t.nbytes())) return {};
  const void* p = runtime::host_address(c, *buf);  // waits for the values
  if (!p) return {};
  return at::from_blob(const_cast<void*>(p), t.sizes(), [buf](void*) {},
                       at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
}

std::atomic<int64_t> g_in_place{0};

// The tpu tensor's own device memory as a CPU tensor that a collective writes its result
// into, as NCCL writes into the tensor it is given: no copy to the host, none back.
// Only where no one else can see the bytes change: the plugin's buffers are host memory,
// the tensor is its whole storage, whose computed buffer nothing else holds (no other
// storage, pending op, transfer or collective), and no launched program still runs on the
// device (one could be reading it). Undefined otherwise: then the values are staged.
at::Tensor in_place_view(const at::Tensor& t, bool host_addresses) {
  if (!host_addresses || t.numel() == 0 || t.is_conj() || t.is_neg() || !t.is_contiguous() ||
      t.storage_offset() != 0 || t.nbytes() != t.storage().nbytes())
    return {};
  runtime::Client& c = runtime::Client::get();
  int device = backend::device_index(t);
  if (!runtime::buffers_in_host_memory(c, device)) return {};
  backend::verify_device_checks();  // values reduced must not come from a failed op
  backend::StorageData& s = backend::storage_of(t);  // its queued writes run first
  if (!s.value || !s.unreadable.empty() || s.copy_of || !s.pending.empty() ||
      !backend::is_ready(s.value) || !backend::all_launched() || !c.is_idle(device) ||
      !backend::sole_holder(s.value))
    return {};
  runtime::BufferPtr buf = backend::resolve(s.value);
  if (buf->nbytes() != static_cast<int64_t>(t.nbytes())) return {};
  void* p = runtime::writable_host_address(c, *buf);
  if (!p) return {};
  backend::drop_host_copy(s);  // the collective changes the buffer's bytes in place
  g_in_place += 1;  // no version bump: as NCCL's writes (staged_work.h's write_result)
  return at::from_blob(p, t.sizes(), [buf](void*) {},
                       at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
}

// Byte ranges of a tpu tensor's values copied to the host by the plugin, for the
// chunked paths (plugins whose buffers are not host memory).
struct Ranges {
  runtime::BufferPtr buf;

  // Opens `t` (pending work runs first) and copies its first range; false (nothing
  // copied) where the plugin offers no raw copies or the buffer is not t's dense values.
  bool open(const at::Tensor& t, void* dst, int64_t offset, int64_t nbytes) {
    backend::verify_device_checks();
    buf = backend::dense_buffer(t);
    if (buf->nbytes() != static_cast<int64_t>(t.nbytes())) return false;
    return runtime::Client::get().to_host_range(*buf, dst, offset, nbytes);
  }
  void copy(void* dst, int64_t offset, int64_t nbytes, const char* what) const {
    TORCH_CHECK(runtime::Client::get().to_host_range(*buf, dst, offset, nbytes), "tpu_dist ",
                what, ": the plugin stopped offering raw copies");
  }
};

}  // namespace

struct HostStagedTransport::Staging {
  // `typed`: Gloo's collective dispatches on the dtype (send/recv move raw bytes).
  Staging(HostPool& p, Sequencer& q, bool addresses, const char* w, bool typed = true)
      : pool(p), sequencer(q), what(w), typed(typed), host_addresses(addresses) {
    // The host tensors staged here are ordinary tensors even under torch.inference_mode():
    // the transport's threads (outside that mode) write them in place. (Leaving the mode
    // turns grad mode on: off again, as it was.)
    if (c10::InferenceMode::is_enabled()) {
      ordinary_tensors.emplace(false);
      no_grad.emplace();
    }
  }
  std::optional<c10::InferenceMode> ordinary_tensors;
  std::optional<at::NoGradGuard> no_grad;
  HostPool& pool;
  Sequencer& sequencer;
  const char* what;  // the collective, for errors
  bool typed;
  bool host_addresses;  // read device memory in place where it is host memory
  // Checks every tensor first: a coalesced form must not send some before failing.
  void check_dtypes(const TensorList& ts) const {
    if (typed)
      for (auto& t : ts) check_host_dtype(what, t);
  }
  std::vector<WorkPtr> inner;
  std::vector<WriteBack> writes;
  std::vector<const void*> touched;  // storages read or written before the Work completes

  // Before the collective reads or writes t's memory: an earlier collective of this
  // group still reading or writing it finishes first, as NCCL's stream orders them
  // (an async all_reduce of x, then another of x, reduces the first one's result).
  void touch(const at::Tensor& t) {
    if (!t.defined()) return;
    const void* storage = t.storage().unsafeGetStorageImpl();
    sequencer.wait_for_earlier(storage);
    touched.push_back(storage);
  }
  TensorList averaged;  // host results of an AVG, summed by the transport

  // A host copy of a tpu tensor's values (waits for them: pending work runs first),
  // copied straight into reused staging memory.
  at::Tensor in(const at::Tensor& t) {
    if (typed) check_host_dtype(what, t);
    touch(t);
    at::Tensor h = pool.take(t.sizes(), t.scalar_type());
    at::Tensor v = host_view(t, host_addresses);
    if (v.defined())  // one plain copy: no transfer, no event, no thread hop
      std::memcpy(h.data_ptr(), v.data_ptr(), h.nbytes());
    else
      h.copy_(t);
    return h;
  }
  // For a transport that only reads its input (all_gather, send): the device memory
  // itself where it is host memory, else a copy.
  at::Tensor in_read_only(const at::Tensor& t) {
    if (typed) check_host_dtype(what, t);
    touch(t);
    at::Tensor v = host_view(t, host_addresses);
    return v.defined() ? v : in(t);
  }
  TensorList in_read_only(const TensorList& ts) {
    TensorList r;
    for (auto& t : ts) r.push_back(in_read_only(t));
    return r;
  }
  // A host tensor whose values go back into `t` when the collective is done: t's own
  // memory where it may be written in place, else staging memory written back.
  at::Tensor out(const at::Tensor& t) {
    if (typed) check_host_dtype(what, t);
    touch(t);
    at::Tensor h = in_place_view(t, host_addresses);
    if (h.defined()) return h;
    h = pool.take(t.sizes(), t.scalar_type());
    writes.push_back({t, h});
    return h;
  }
  at::Tensor inout(const at::Tensor& t) {
    if (typed) check_host_dtype(what, t);
    touch(t);
    at::Tensor h = in_place_view(t, host_addresses);
    if (h.defined()) return h;
    h = in(t);
    writes.push_back({t, h});
    return h;
  }
  TensorList in(const TensorList& ts) {
    TensorList r;
    for (auto& t : ts) r.push_back(in(t));
    return r;
  }
  TensorList out(const TensorList& ts) {
    TensorList r;
    for (auto& t : ts) r.push_back(out(t));
    return r;
  }
  // Gloo gets SUM for AVG; the division happens on the host results.
  c10d::ReduceOp op(const c10d::ReduceOp& op, const TensorList& host_results) {
    if (op != c10d::ReduceOp::AVG) return op;
    averaged.insert(averaged.end(), host_results.begin(), host_results.end());
    return c10d::ReduceOp(c10d::ReduceOp::SUM);
  }
};

namespace {
// Where the plugin copies device memory to the host, a tensor of 2 chunks or more goes
// chunk by chunk, each chunk's transport call overlapping the next one's copy (below
// that, the copy is short next to Gloo's own per-call cost). Where buffers are host
// memory there is no transfer to overlap: values are read, or written, in place or by
// one memcpy, and a collective makes one call (Gloo's per-call cost is the larger one
// there: about 6 ms with 4 ranks on 2 cores). Decided by the plugin and the size only,
// so every rank makes the same transport calls.
bool pipelined(const at::Tensor& t, int64_t chunk_bytes, bool host_addresses) {
  if (host_addresses && runtime::buffers_in_host_memory(runtime::Client::get(), backend::device_index(t)))
    return false;
  return t.nbytes() >= static_cast<size_t>(2 * chunk_bytes) && !t.is_conj() && !t.is_neg();
}

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

int64_t chunk_bytes_from_env() {
  const char* v = std::getenv("TPU_DIST_CHUNK_BYTES");
  if (!v || !*v) return 4 << 20;
  char* end = nullptr;
  long long n = std::strtoll(v, &end, 10);
  TORCH_CHECK_VALUE(end && *end == '\0' && n > 0, "tpu_dist: TPU_DIST_CHUNK_BYTES must be a "
                    "positive number of bytes, got '", v, "'");
  return n;
}
}  // namespace

HostStagedTransport::HostStagedTransport(c10::intrusive_ptr<c10d::Backend> host)
    : c10d::Backend(host->getRank(), host->getSize()),
      host_(std::move(host)),
      chunk_bytes_(chunk_bytes_from_env()),
      host_addresses_(!env_is("TPU_DIST_HOST_ADDRESSES", "0")),
      sequencer_(std::make_shared<Sequencer>()) {}

HostStagedTransport::~HostStagedTransport() { sequencer_->drain_all(); }

WorkPtr HostStagedTransport::finish(Staging& s, OpType op, const char* what, TensorList results) {
  std::function<void()> divide;
  if (!s.averaged.empty()) {
    int64_t n = getSize();
    divide = [avg = std::move(s.averaged), n]() mutable {
      for (auto& h : avg) {
        if (at::isFloatingType(h.scalar_type()) || at::isComplexType(h.scalar_type()))
          h.div_(n);
        else
          h.div_(n, "trunc");
      }
    };
  }
  // What later collectives must wait for: the storages it read or writes in place, and
  // those its results are written back into.
  for (const WriteBack& wb : s.writes) s.touched.push_back(wb.device.storage().unsafeGetStorageImpl());
  auto w = c10::make_intrusive<StagedWork>(getRank(), op, what, std::move(s.inner),
                                           std::move(s.writes), std::move(divide),
                                           std::move(results));
  w->set_touched(std::move(s.touched));
  sequencer_->enqueue(w);
  return w;
}

WorkPtr HostStagedTransport::broadcast(TensorList& tensors, const c10d::BroadcastOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "broadcast");
  bool root = getRank() == opts.rootRank;
  TensorList h = root ? s.in(tensors) : s.out(tensors);
  s.inner.push_back(host_->broadcast(h, opts));
  return finish(s, OpType::BROADCAST, "broadcast", tensors);
}


WorkPtr HostStagedTransport::allreduce(TensorList& tensors, const c10d::AllreduceOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "all_reduce");
  if (tensors.size() == 1 && pipelined(tensors[0], chunk_bytes_, host_addresses_)) {
    // Copied to the host and reduced chunk by chunk: each chunk's Gloo all-reduce runs
    // while the next chunk is copied.
    at::Tensor& t = tensors[0];
    check_host_dtype("all_reduce", t);
    s.touch(t);
    at::Tensor h = pool_.take(t.sizes(), t.scalar_type());
    int64_t item = h.element_size(), per = std::max<int64_t>(1, chunk_bytes_ / item);
    int64_t n = h.numel();
    char* base = static_cast<char*>(h.data_ptr());
    Ranges src;
    if (src.open(t, base, 0, std::min(per, n) * item)) {
      s.writes.push_back({t, h});
      c10d::AllreduceOptions o = opts;
      o.reduceOp = s.op(opts.reduceOp, {h});
      at::Tensor flat = h.view(-1);
      for (int64_t a = 0; a < n; a += per) {
        int64_t len = std::min(per, n - a);
        if (a > 0) src.copy(base + a * item, a * item, len * item, "all_reduce");
        TensorList chunk{flat.narrow(0, a, len)};
        s.inner.push_back(host_->allreduce(chunk, o));
      }
      return finish(s, OpType::ALLREDUCE, "all_reduce", tensors);
    }
  }
  TensorList h;
  for (auto& t : tensors) h.push_back(s.inout(t));
  c10d::AllreduceOptions o = opts;
  o.reduceOp = s.op(opts.reduceOp, h);
  s.inner.push_back(host_->allreduce(h, o));
  return finish(s, OpType::ALLREDUCE, "all_reduce", tensors);
}

WorkPtr HostStagedTransport::allreduce_coalesced(TensorList& tensors,
                                                 const c10d::AllreduceCoalescedOptions& opts) {
  // One transport collective per tensor (Gloo's coalesced form wants one dtype).
  Staging s(pool_, *sequencer_, host_addresses_, "all_reduce_coalesced");
  s.check_dtypes(tensors);
  c10d::AllreduceOptions o;
  o.timeout = opts.timeout;
  for (auto& t : tensors) {
    TensorList h{s.inout(t)};
    o.reduceOp = s.op(opts.reduceOp, h);
    s.inner.push_back(host_->allreduce(h, o));
  }
  return finish(s, OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", tensors);
}

WorkPtr HostStagedTransport::reduce(TensorList& tensors, const c10d::ReduceOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "reduce");
  bool root = getRank() == opts.rootRank;
  TensorList h = root ? TensorList{s.inout(tensors[0])} : s.in(tensors);
  c10d::ReduceOptions o = opts;
  o.reduceOp = root ? s.op(opts.reduceOp, h) : (opts.reduceOp == c10d::ReduceOp::AVG
                                                   ? c10d::ReduceOp(c10d::ReduceOp::SUM)
                                                   : opts.reduceOp);
  s.inner.push_back(host_->reduce(h, o));
  return finish(s, OpType::REDUCE, "reduce", tensors);
}

WorkPtr HostStagedTransport::allgather(std::vector<TensorList>& outputs, TensorList& inputs,
                                       const c10d::AllgatherOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "all_gather");
  int64_t most = 0;
  bool even = true;
  for (const at::Tensor& o : outputs[0]) {
    most = std::max<int64_t>(most, o.numel());
    even = even && o.numel() == inputs[0].numel();
  }
  if (!even) {
    // Ranks' pieces of different sizes (NCCL allows them; Gloo's all_gather does not):
    // each rank's padded to the largest, gathered flat, each piece written back from
    // its place.
    at::Tensor mine = s.in(inputs[0]);
    at::Tensor padded = pool_.take({most}, inputs[0].scalar_type());
    padded.zero_();
    std::memcpy(padded.data_ptr(), mine.data_ptr(), mine.nbytes());
    at::Tensor flat = pool_.take({getSize() * most}, inputs[0].scalar_type());
    s.inner.push_back(host_->_allgather_base(flat, padded, opts));
    for (size_t i = 0; i < outputs[0].size(); ++i) {
      const at::Tensor& o = outputs[0][i];
      s.writes.push_back({o, flat.narrow(0, static_cast<int64_t>(i) * most, o.numel()).view(o.sizes())});
    }
    return finish(s, OpType::ALLGATHER, "all_gather", outputs[0]);
  }
  TensorList in = s.in_read_only(inputs);
  std::vector<TensorList> out{s.out(outputs[0])};
  s.inner.push_back(host_->allgather(out, in, opts));
  WorkPtr w = finish(s, OpType::ALLGATHER, "all_gather", outputs[0]);
  bump_versions_as_nccls_all_gather(outputs[0]);
  return w;
}

WorkPtr HostStagedTransport::_allgather_base(at::Tensor& output, at::Tensor& input,
                                             const c10d::AllgatherOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "all_gather_into_tensor");
  // Flat on the host: Gloo wants the output as inputs stacked along dimension 0.
  at::Tensor in = s.in_read_only(input).view(-1), out = s.out(output).view(-1);
  s.inner.push_back(host_->_allgather_base(out, in, opts));
  return finish(s, OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {output});
}

WorkPtr HostStagedTransport::allgather_coalesced(std::vector<TensorList>& outputs,
                                                 TensorList& inputs,
                                                 const c10d::AllgatherOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "all_gather_coalesced");
  s.check_dtypes(inputs);
  TensorList results;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TensorList in{s.in_read_only(inputs[i])};
    std::vector<TensorList> out{s.out(outputs[i])};
    s.inner.push_back(host_->allgather(out, in, opts));
    results.insert(results.end(), outputs[i].begin(), outputs[i].end());
  }
  return finish(s, OpType::ALLGATHER_COALESCED, "all_gather_coalesced", results);
}

WorkPtr HostStagedTransport::allgather_into_tensor_coalesced(TensorList& outputs,
                                                             TensorList& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "all_gather_into_tensor_coalesced");
  s.check_dtypes(inputs);
  s.check_dtypes(outputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor in = s.in_read_only(inputs[i]).view(-1), out = s.out(outputs[i]).view(-1);
    s.inner.push_back(host_->_allgather_base(out, in, opts));
  }
  return finish(s, OpType::COALESCED, "all_gather_into_tensor_coalesced", outputs);
}

WorkPtr HostStagedTransport::gather(std::vector<TensorList>& outputs, TensorList& inputs,
                                    const c10d::GatherOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "gather");
  // Gloo's gather takes no complex dtype (its other collectives do): complex values
  // travel as their (real, imaginary) pairs.
  auto as_real = [](TensorList ts) {
    for (at::Tensor& t : ts)
      if (t.is_complex()) t = at::view_as_real(t);
    return ts;
  };
  TensorList in = as_real(s.in(inputs));
  std::vector<TensorList> out;
  if (getRank() == opts.rootRank) out.push_back(as_real(s.out(outputs[0])));
  s.inner.push_back(host_->gather(out, in, opts));
  return finish(s, OpType::GATHER, "gather", outputs.empty() ? TensorList{} : outputs[0]);
}

WorkPtr HostStagedTransport::scatter(TensorList& outputs, std::vector<TensorList>& inputs,
                                     const c10d::ScatterOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "scatter");
  std::vector<TensorList> in;
  if (getRank() == opts.rootRank) in.push_back(s.in(inputs[0]));
  TensorList out = s.out(outputs);
  s.inner.push_back(host_->scatter(out, in, opts));
  return finish(s, OpType::SCATTER, "scatter", outputs);
}

WorkPtr HostStagedTransport::reduce_scatter(TensorList& outputs, std::vector<TensorList>& inputs,
                                            const c10d::ReduceScatterOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "reduce_scatter");
  std::vector<TensorList> in{s.in(inputs[0])};
  TensorList out = s.out(outputs);
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = s.op(opts.reduceOp, out);
  s.inner.push_back(host_->reduce_scatter(out, in, o));
  return finish(s, OpType::REDUCE_SCATTER, "reduce_scatter", outputs);
}

WorkPtr HostStagedTransport::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                  const c10d::ReduceScatterOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "reduce_scatter_tensor");
  if (pipelined(input, chunk_bytes_, host_addresses_) && output.numel() > 0) {
    // Chunk by chunk, as all_reduce: chunk c takes elements [a, a + len) of every rank's
    // block. Its pieces are copied next to each other ([rank][len]), so each chunk is one
    // contiguous Gloo reduce-scatter whose output is [a, a + len) of this rank's result.
    check_host_dtype("reduce_scatter_tensor", input);
    check_host_dtype("reduce_scatter_tensor", output);
    s.touch(input);
    s.touch(output);
    int64_t world = getSize(), m = output.numel();
    at::Tensor hin = pool_.take({world * m}, input.scalar_type());
    at::Tensor hout = pool_.take(output.sizes(), output.scalar_type());
    int64_t item = hin.element_size();
    int64_t per = std::max<int64_t>(1, chunk_bytes_ / (item * world));
    char* base = static_cast<char*>(hin.data_ptr());
    int64_t len0 = std::min(per, m);
    Ranges src;
    if (src.open(input, base, 0, len0 * item)) {
      at::Tensor flat_out = hout.view(-1);
      c10d::ReduceScatterOptions o = opts;
      o.reduceOp = s.op(opts.reduceOp, {hout});
      s.writes.push_back({output, hout});
      for (int64_t a = 0; a < m; a += per) {
        int64_t len = std::min(per, m - a);
        for (int64_t r = 0; r < world; ++r) {
          if (a == 0 && r == 0) continue;  // open() copied it
          src.copy(base + (a * world + r * len) * item, (r * m + a) * item, len * item,
                   "reduce_scatter_tensor");
        }
        at::Tensor in = hin.narrow(0, a * world, world * len), out = flat_out.narrow(0, a, len);
        s.inner.push_back(host_->_reduce_scatter_base(out, in, o));
      }
      return finish(s, OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output});
    }
  }
  // Gloo's reduce-scatter leaves its input as it was: read in place where it can be.
  at::Tensor in = s.in_read_only(input).view(-1), out = s.out(output).view(-1);
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = s.op(opts.reduceOp, {out});
  s.inner.push_back(host_->_reduce_scatter_base(out, in, o));
  return finish(s, OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output});
}

WorkPtr HostStagedTransport::reduce_scatter_tensor_coalesced(
    TensorList& outputs, TensorList& inputs, const c10d::ReduceScatterOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "reduce_scatter_tensor_coalesced");
  s.check_dtypes(inputs);
  s.check_dtypes(outputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor in = s.in_read_only(inputs[i]).view(-1), out = s.out(outputs[i]).view(-1);
    c10d::ReduceScatterOptions o = opts;
    o.reduceOp = s.op(opts.reduceOp, {out});
    s.inner.push_back(host_->_reduce_scatter_base(out, in, o));
  }
  return finish(s, OpType::COALESCED, "reduce_scatter_tensor_coalesced", outputs);
}

WorkPtr HostStagedTransport::alltoall_base(at::Tensor& output, at::Tensor& input,
                                           std::vector<int64_t>& output_splits,
                                           std::vector<int64_t>& input_splits,
                                           const c10d::AllToAllOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "all_to_all_single");
  at::Tensor in = s.in(input), out = s.out(output);
  s.inner.push_back(host_->alltoall_base(out, in, output_splits, input_splits, opts));
  return finish(s, OpType::ALLTOALL_BASE, "all_to_all_single", {output});
}

WorkPtr HostStagedTransport::alltoall(TensorList& outputs, TensorList& inputs,
                                      const c10d::AllToAllOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "all_to_all");
  bool even = true;
  for (size_t i = 0; i < inputs.size(); ++i)
    even = even && inputs[i].numel() == inputs[0].numel() && outputs[i].numel() == inputs[0].numel();
  if (even) {
    TensorList in = s.in(inputs), out = s.out(outputs);
    s.inner.push_back(host_->alltoall(out, in, opts));
    return finish(s, OpType::ALLTOALL, "all_to_all", outputs);
  }
  // Pieces of different sizes (NCCL takes them, Gloo's list form does not): one flat
  // exchange split by the pieces' element counts, each output piece written back from
  // its part of the result.
  for (const TensorList* ts : {&inputs, &outputs})
    for (const at::Tensor& t : *ts)
      TORCH_CHECK_TYPE(t.scalar_type() == inputs[0].scalar_type(), "distributed.all_to_all(): pieces of ",
                       "different sizes must share one dtype, got ", inputs[0].scalar_type(), " and ",
                       t.scalar_type());
  s.check_dtypes(inputs);
  std::vector<int64_t> in_splits, out_splits;
  TensorList flat_in;
  for (const at::Tensor& t : inputs) {
    flat_in.push_back(s.in(t).reshape(-1));
    in_splits.push_back(t.numel());
  }
  int64_t total = 0;
  for (const at::Tensor& t : outputs) total += t.numel();
  at::Tensor in = at::cat(flat_in), out = pool_.take({total}, outputs[0].scalar_type());
  int64_t offset = 0;
  for (const at::Tensor& t : outputs) {
    s.writes.push_back({t, out.narrow(0, offset, t.numel()).view(t.sizes())});
    out_splits.push_back(t.numel());
    offset += t.numel();
  }
  s.inner.push_back(host_->alltoall_base(out, in, out_splits, in_splits, opts));
  return finish(s, OpType::ALLTOALL, "all_to_all", outputs);
}

WorkPtr HostStagedTransport::send(TensorList& tensors, int dst, int tag) {
  Staging s(pool_, *sequencer_, host_addresses_, "send", /*typed=*/false);
  TensorList h = s.in_read_only(tensors);
  s.inner.push_back(host_->send(h, dst, tag));
  return finish(s, OpType::SEND, "send", {});
}

WorkPtr HostStagedTransport::recv(TensorList& tensors, int src, int tag) {
  Staging s(pool_, *sequencer_, host_addresses_, "recv", /*typed=*/false);
  TensorList h = s.out(tensors);
  s.inner.push_back(host_->recv(h, src, tag));
  return finish(s, OpType::RECV, "recv", tensors);
}

WorkPtr HostStagedTransport::recvAnysource(TensorList& tensors, int tag) {
  Staging s(pool_, *sequencer_, host_addresses_, "recv", /*typed=*/false);
  TensorList h = s.out(tensors);
  s.inner.push_back(host_->recvAnysource(h, tag));
  return finish(s, OpType::RECVANYSOURCE, "recv", tensors);
}

WorkPtr HostStagedTransport::barrier(const c10d::BarrierOptions& opts) {
  Staging s(pool_, *sequencer_, host_addresses_, "barrier");
  s.inner.push_back(host_->barrier(opts));
  return finish(s, OpType::BARRIER, "barrier", {});
}

int64_t collective_writes_in_place() { return g_in_place.load(); }

}  // namespace tpu::distributed
