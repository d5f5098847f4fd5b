#include "distributed/host_staged.h"

#include <ATen/ATen.h>

#include "backend/device_checks.h"
#include "backend/storage.h"
#include "runtime/client.h"

namespace tpu::distributed {

using c10d::OpType;
using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;
using TensorList = std::vector<at::Tensor>;

struct HostStagedTransport::Staging {
  explicit Staging(HostPool& p) : pool(p) {}
  HostPool& pool;
  std::vector<WorkPtr> inner;
  std::vector<WriteBack> writes;
  TensorList averaged;  // host results of an AVG, summed by the transport

  // A host copy of a tpu tensor's values (waits for them: pending work runs first),
  // copied straight into reused staging memory.
  at::Tensor in(const at::Tensor& t) {
    at::Tensor h = pool.take(t.sizes(), t.scalar_type());
    h.copy_(t);
    return h;
  }
  // A host tensor whose values go back into `t` when the collective is done.
  at::Tensor out(const at::Tensor& t) {
    at::Tensor h = pool.take(t.sizes(), t.scalar_type());
    writes.push_back({t, h});
    return h;
  }
  at::Tensor inout(const at::Tensor& t) {
    at::Tensor h = in(t);
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

HostStagedTransport::HostStagedTransport(c10::intrusive_ptr<c10d::Backend> host)
    : c10d::Backend(host->getRank(), host->getSize()),
      host_(std::move(host)),
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
  auto w = c10::make_intrusive<StagedWork>(getRank(), op, what, std::move(s.inner),
                                           std::move(s.writes), std::move(divide),
                                           std::move(results));
  sequencer_->enqueue(w);
  return w;
}

WorkPtr HostStagedTransport::broadcast(TensorList& tensors, const c10d::BroadcastOptions& opts) {
  Staging s(pool_);
  bool root = getRank() == opts.rootRank;
  TensorList h = root ? s.in(tensors) : s.out(tensors);
  s.inner.push_back(host_->broadcast(h, opts));
  return finish(s, OpType::BROADCAST, "broadcast", tensors);
}

namespace {
// A large all-reduce is copied to the host and reduced chunk by chunk: each chunk's
// transport collective runs while the next chunk is copied.
constexpr int64_t kChunkBytes = 4 << 20;

bool pipelined(const at::Tensor& t) {
  return t.nbytes() >= 2 * kChunkBytes && !t.is_conj() && !t.is_neg();
}
}  // namespace

WorkPtr HostStagedTransport::allreduce(TensorList& tensors, const c10d::AllreduceOptions& opts) {
  Staging s(pool_);
  if (tensors.size() == 1 && pipelined(tensors[0])) {
    at::Tensor& t = tensors[0];
    backend::verify_device_checks();  // values read back must not come from a failed op
    runtime::BufferPtr buf = backend::dense_buffer(t);  // pending work runs first
    at::Tensor h = pool_.take(t.sizes(), t.scalar_type());
    int64_t item = h.element_size(), per = kChunkBytes / item, n = h.numel();
    char* base = static_cast<char*>(h.data_ptr());
    if (buf->nbytes() == static_cast<int64_t>(h.nbytes()) &&
        runtime::Client::get().to_host_range(*buf, base, 0, per * item)) {
      s.writes.push_back({t, h});
      c10d::AllreduceOptions o = opts;
      o.reduceOp = s.op(opts.reduceOp, {h});
      at::Tensor flat = h.view(-1);
      for (int64_t a = 0; a < n; a += per) {
        int64_t len = std::min(per, n - a);
        if (a > 0) {
          TORCH_CHECK(runtime::Client::get().to_host_range(*buf, base + a * item, a * item,
                                                           len * item),
                      "tpu_dist all_reduce: the plugin stopped offering raw copies");
        }
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
  Staging s(pool_);
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
  Staging s(pool_);
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
  Staging s(pool_);
  TensorList in = s.in(inputs);
  std::vector<TensorList> out{s.out(outputs[0])};
  s.inner.push_back(host_->allgather(out, in, opts));
  return finish(s, OpType::ALLGATHER, "all_gather", outputs[0]);
}

WorkPtr HostStagedTransport::_allgather_base(at::Tensor& output, at::Tensor& input,
                                             const c10d::AllgatherOptions& opts) {
  Staging s(pool_);
  // Flat on the host: Gloo wants the output as inputs stacked along dimension 0.
  at::Tensor in = s.in(input).view(-1), out = s.out(output).view(-1);
  s.inner.push_back(host_->_allgather_base(out, in, opts));
  return finish(s, OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {output});
}

WorkPtr HostStagedTransport::allgather_coalesced(std::vector<TensorList>& outputs,
                                                 TensorList& inputs,
                                                 const c10d::AllgatherOptions& opts) {
  Staging s(pool_);
  TensorList results;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TensorList in{s.in(inputs[i])};
    std::vector<TensorList> out{s.out(outputs[i])};
    s.inner.push_back(host_->allgather(out, in, opts));
    results.insert(results.end(), outputs[i].begin(), outputs[i].end());
  }
  return finish(s, OpType::ALLGATHER_COALESCED, "all_gather_coalesced", results);
}

WorkPtr HostStagedTransport::allgather_into_tensor_coalesced(TensorList& outputs,
                                                             TensorList& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  Staging s(pool_);
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor in = s.in(inputs[i]).view(-1), out = s.out(outputs[i]).view(-1);
    s.inner.push_back(host_->_allgather_base(out, in, opts));
  }
  return finish(s, OpType::COALESCED, "all_gather_into_tensor_coalesced", outputs);
}

WorkPtr HostStagedTransport::gather(std::vector<TensorList>& outputs, TensorList& inputs,
                                    const c10d::GatherOptions& opts) {
  Staging s(pool_);
  TensorList in = s.in(inputs);
  std::vector<TensorList> out;
  if (getRank() == opts.rootRank) out.push_back(s.out(outputs[0]));
  s.inner.push_back(host_->gather(out, in, opts));
  return finish(s, OpType::GATHER, "gather", outputs.empty() ? TensorList{} : outputs[0]);
}

WorkPtr HostStagedTransport::scatter(TensorList& outputs, std::vector<TensorList>& inputs,
                                     const c10d::ScatterOptions& opts) {
  Staging s(pool_);
  std::vector<TensorList> in;
  if (getRank() == opts.rootRank) in.push_back(s.in(inputs[0]));
  TensorList out = s.out(outputs);
  s.inner.push_back(host_->scatter(out, in, opts));
  return finish(s, OpType::SCATTER, "scatter", outputs);
}

WorkPtr HostStagedTransport::reduce_scatter(TensorList& outputs, std::vector<TensorList>& inputs,
                                            const c10d::ReduceScatterOptions& opts) {
  Staging s(pool_);
  std::vector<TensorList> in{s.in(inputs[0])};
  TensorList out = s.out(outputs);
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = s.op(opts.reduceOp, out);
  s.inner.push_back(host_->reduce_scatter(out, in, o));
  return finish(s, OpType::REDUCE_SCATTER, "reduce_scatter", outputs);
}

WorkPtr HostStagedTransport::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                  const c10d::ReduceScatterOptions& opts) {
  Staging s(pool_);
  at::Tensor in = s.in(input).view(-1), out = s.out(output).view(-1);
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = s.op(opts.reduceOp, {out});
  s.inner.push_back(host_->_reduce_scatter_base(out, in, o));
  return finish(s, OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output});
}

WorkPtr HostStagedTransport::reduce_scatter_tensor_coalesced(
    TensorList& outputs, TensorList& inputs, const c10d::ReduceScatterOptions& opts) {
  Staging s(pool_);
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor in = s.in(inputs[i]).view(-1), out = s.out(outputs[i]).view(-1);
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
  Staging s(pool_);
  at::Tensor in = s.in(input), out = s.out(output);
  s.inner.push_back(host_->alltoall_base(out, in, output_splits, input_splits, opts));
  return finish(s, OpType::ALLTOALL_BASE, "all_to_all_single", {output});
}

WorkPtr HostStagedTransport::alltoall(TensorList& outputs, TensorList& inputs,
                                      const c10d::AllToAllOptions& opts) {
  Staging s(pool_);
  TensorList in = s.in(inputs), out = s.out(outputs);
  s.inner.push_back(host_->alltoall(out, in, opts));
  return finish(s, OpType::ALLTOALL, "all_to_all", outputs);
}

WorkPtr HostStagedTransport::send(TensorList& tensors, int dst, int tag) {
  Staging s(pool_);
  TensorList h = s.in(tensors);
  s.inner.push_back(host_->send(h, dst, tag));
  return finish(s, OpType::SEND, "send", {});
}

WorkPtr HostStagedTransport::recv(TensorList& tensors, int src, int tag) {
  Staging s(pool_);
  TensorList h = s.out(tensors);
  s.inner.push_back(host_->recv(h, src, tag));
  return finish(s, OpType::RECV, "recv", tensors);
}

WorkPtr HostStagedTransport::recvAnysource(TensorList& tensors, int tag) {
  Staging s(pool_);
  TensorList h = s.out(tensors);
  s.inner.push_back(host_->recvAnysource(h, tag));
  return finish(s, OpType::RECVANYSOURCE, "recv", tensors);
}

WorkPtr HostStagedTransport::barrier(const c10d::BarrierOptions& opts) {
  Staging s(pool_);
  s.inner.push_back(host_->barrier(opts));
  return finish(s, OpType::BARRIER, "barrier", {});
}

}  // namespace tpu::distributed
