#include "distributed/device_collectives.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>

#include "backend/device_checks.h"
#include "backend/dtypes.h"
#include "backend/storage.h"
#include "distributed/checks.h"
#include "runtime/client.h"

namespace tpu::distributed {

using c10d::OpType;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using TensorList = std::vector<at::Tensor>;

namespace {

ir::ReduceKind reduce_kind(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ir::ReduceKind::Sum;
    case c10d::ReduceOp::AVG: return ir::ReduceKind::Avg;
    case c10d::ReduceOp::PRODUCT: return ir::ReduceKind::Product;
    case c10d::ReduceOp::MIN: return ir::ReduceKind::Min;
    case c10d::ReduceOp::MAX: return ir::ReduceKind::Max;
    case c10d::ReduceOp::BAND: return ir::ReduceKind::BitAnd;
    case c10d::ReduceOp::BOR: return ir::ReduceKind::BitOr;
    case c10d::ReduceOp::BXOR: return ir::ReduceKind::BitXor;
    default: break;
  }
  TORCH_CHECK_VALUE(false, "tpu_dist's device transport has no program for this reduce op");
}

// The Work of a collective's programs: waits for their results (on the sequencer's
// helper thread: it has no future, so no plugin thread ever runs Python callbacks).
class ProgramWork : public c10d::Work {
 public:
  ProgramWork(int rank, OpType op, std::vector<runtime::BufferPtr> produced)
      : c10d::Work(rank, op), produced_(std::move(produced)) {}
  bool wait(std::chrono::milliseconds) override {
    runtime::Client& c = runtime::Client::get();
    for (auto& b : produced_) runtime::await_ready(c, *b);
    produced_.clear();
    return true;
  }

 private:
  std::vector<runtime::BufferPtr> produced_;
};

// Writes `value` (a buffer of `src` dims) into `dst` (same number of elements).
void put(const at::Tensor& dst, const runtime::BufferPtr& value, int device) {
  std::vector<int64_t> dims = value->dims();
  at::Tensor w = backend::wrap_value(backend::Operand(value), dst.scalar_type(), dims, device);
  write_result(dst, w.reshape(dst.sizes()));
}

// `dst` pieces, in order, from a flat result buffer.
void put_pieces(const TensorList& dst, const runtime::BufferPtr& value, int device,
                c10::ScalarType dtype) {
  at::Tensor w = backend::wrap_value(backend::Operand(value), dtype, value->dims(), device);
  int64_t at = 0;
  for (auto& d : dst) {
    write_result(d, w.narrow(0, at, d.numel()).view(d.sizes()));
    at += d.numel();
  }
}

at::Tensor flat(const at::Tensor& t) { return t.reshape({-1}); }

at::Tensor flat_cat(const TensorList& ts) {
  TensorList f;
  for (auto& t : ts) f.push_back(flat(t));
  return at::cat(f);
}

}  // namespace

std::string device_transport_blocker(const std::vector<int64_t>& ids) {
  runtime::Client& c = runtime::Client::get();
  std::vector<int64_t> known = runtime::all_global_device_ids(c);
  std::string sees = "the " + c.platform() + " plugin's client sees " +
                     std::to_string(known.size()) + " devices, " +
                     std::to_string(c.device_count()) + " of them in this process";
  for (size_t r = 0; r < ids.size(); ++r) {
    for (size_t q = 0; q < r; ++q)
      if (ids[q] == ids[r])
        return "ranks " + std::to_string(q) + " and " + std::to_string(r) + " both use device " +
               std::to_string(ids[r]) + ": each process's client reaches only its own devices (" +
               sees + "); the device transport needs one client spanning the group's " +
               std::to_string(ids.size()) + " processes";
    if (std::find(known.begin(), known.end(), ids[r]) == known.end())
      return "rank " + std::to_string(r) + "'s device " + std::to_string(ids[r]) +
             " is not a device of this process's client (" + sees + ")";
  }
  return "";
}

DeviceTransport::DeviceTransport(c10::intrusive_ptr<c10d::Backend> host, std::vector<int64_t> ids,
                                 int local)
    : c10d::Backend(host->getRank(), host->getSize()),
      host_(host),
      staged_(c10::make_intrusive<HostStagedTransport>(host)),
      ids_(std::move(ids)),
      local_(local),
      sequencer_(std::make_shared<Sequencer>()) {}

DeviceTransport::~DeviceTransport() { sequencer_->drain_all(); }

size_t DeviceTransport::num_programs() {
  std::lock_guard<std::mutex> lock(mu_);
  return programs_.size();
}

runtime::BufferPtr DeviceTransport::launch(ir::CollectiveSpec s, const at::Tensor& operand,
                                           const char* what) {
  int dev = backend::device_index(operand);
  TORCH_CHECK_VALUE(dev == local_, "distributed.", what, "(): ", describe(operand),
                    " is not on this rank's device tpu:", local_,
                    " (the device transport runs one device per rank)");
  DType dt = backend::to_dtype(operand.scalar_type());
  TORCH_CHECK_TYPE(dt != DType::Invalid, "distributed.", what, "(): tpu_dist's device transport "
                   "does not take ", describe(operand));
  backend::verify_device_checks();  // values sent must not come from a failed op
  at::Tensor src = operand.resolve_conj().resolve_neg();
  runtime::BufferPtr in = backend::dense_buffer(src);  // pending work runs first
  s.dtype = dt;
  s.shape = in->dims();
  s.num_replicas = getSize();
  std::string key = s.key();
  for (int64_t id : ids_) key += "@" + std::to_string(id);
  runtime::ReplicatedPtr exe;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = programs_.find(key);
    if (it != programs_.end()) exe = it->second;
  }
  if (!exe) {
    // One executable per program in the process, shared by every group over the same
    // devices: ranks that are threads of one process must launch the same executable
    // (the XLA CPU plugin matches a collective's participants by the op's id in it).
    static std::mutex shared_mu;
    static auto* shared = new std::unordered_map<std::string, runtime::ReplicatedPtr>();
    std::lock_guard<std::mutex> lock(shared_mu);
    auto it = shared->find(key);
    if (it != shared->end()) {
      exe = it->second;
    } else {
      std::string text;
      try {
        text = ir::collective_module(s);
      } catch (const ir::UnsupportedCollective& e) {
        TORCH_CHECK_VALUE(false, "distributed.", what, "(): ", e.what());
      }
      std::string name = std::string("tpu_dist ") + what + " (" + key + ")";
      exe = runtime::compile_replicated(runtime::Client::get(), text, ids_, name);
      shared->emplace(key, exe);
    }
    std::lock_guard<std::mutex> mine(mu_);
    programs_.emplace(key, exe);
  }
  return runtime::execute_replica(runtime::Client::get(), *exe, getRank(), {in.get()})[0];
}

WorkPtr DeviceTransport::finish(OpType op, const char* what,
                                std::vector<runtime::BufferPtr> produced, TensorList results) {
  std::vector<WorkPtr> inner;
  if (!produced.empty())
    inner.push_back(c10::make_intrusive<ProgramWork>(getRank(), op, std::move(produced)));
  auto w = c10::make_intrusive<StagedWork>(getRank(), op, what, std::move(inner),
                                           std::vector<WriteBack>{}, nullptr, std::move(results));
  sequencer_->enqueue(w);
  return w;
}

WorkPtr DeviceTransport::broadcast(TensorList& tensors, const c10d::BroadcastOptions& opts) {
  std::vector<runtime::BufferPtr> produced;
  for (auto& t : tensors) {
    if (t.numel() == 0) continue;
    ir::CollectiveSpec s;
    s.kind = ir::CollectiveKind::Broadcast;
    s.root = opts.rootRank;
    produced.push_back(launch(s, t, "broadcast"));
    put(t, produced.back(), local_);
  }
  return finish(OpType::BROADCAST, "broadcast", std::move(produced), tensors);
}

WorkPtr DeviceTransport::allreduce(TensorList& tensors, const c10d::AllreduceOptions& opts) {
  std::vector<runtime::BufferPtr> produced;
  for (auto& t : tensors) {
    if (t.numel() == 0) continue;
    ir::CollectiveSpec s;
    s.kind = ir::CollectiveKind::AllReduce;
    s.reduce = reduce_kind(opts.reduceOp);
    produced.push_back(launch(s, t, "all_reduce"));
    put(t, produced.back(), local_);
  }
  return finish(OpType::ALLREDUCE, "all_reduce", std::move(produced), tensors);
}

WorkPtr DeviceTransport::allreduce_coalesced(TensorList& tensors,
                                             const c10d::AllreduceCoalescedOptions& opts) {
  std::vector<runtime::BufferPtr> produced;
  for (auto& t : tensors) {
    if (t.numel() == 0) continue;
    ir::CollectiveSpec s;
    s.kind = ir::CollectiveKind::AllReduce;
    s.reduce = reduce_kind(opts.reduceOp);
    produced.push_back(launch(s, t, "all_reduce_coalesced"));
    put(t, produced.back(), local_);
  }
  return finish(OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", std::move(produced), tensors);
}

WorkPtr DeviceTransport::reduce(TensorList& tensors, const c10d::ReduceOptions& opts) {
  // An all-reduce whose result only the destination keeps.
  std::vector<runtime::BufferPtr> produced;
  for (auto& t : tensors) {
    if (t.numel() == 0) continue;
    ir::CollectiveSpec s;
    s.kind = ir::CollectiveKind::AllReduce;
    s.reduce = reduce_kind(opts.reduceOp);
    produced.push_back(launch(s, t, "reduce"));
    if (getRank() == opts.rootRank) put(t, produced.back(), local_);
  }
  return finish(OpType::REDUCE, "reduce", std::move(produced), tensors);
}

WorkPtr DeviceTransport::allgather(std::vector<TensorList>& outputs, TensorList& inputs,
                                   const c10d::AllgatherOptions& opts) {
  for (const at::Tensor& piece : outputs[0])  // ranks' pieces of other sizes: staged
    if (piece.numel() != inputs[0].numel()) return staged_->allgather(outputs, inputs, opts);
  std::vector<runtime::BufferPtr> produced;
  if (inputs[0].numel() > 0) {
    ir::CollectiveSpec s;
    s.kind = ir::CollectiveKind::AllGather;
    produced.push_back(launch(s, flat(inputs[0]), "all_gather"));
    put_pieces(outputs[0], produced.back(), local_, inputs[0].scalar_type());
  }
  bump_versions_as_nccls_all_gather(outputs[0]);
  return finish(OpType::ALLGATHER, "all_gather", std::move(produced), outputs[0]);
}

WorkPtr DeviceTransport::_allgather_base(at::Tensor& output, at::Tensor& input,
                                         const c10d::AllgatherOptions&) {
  std::vector<runtime::BufferPtr> produced;
  if (input.numel() > 0) {
    ir::CollectiveSpec s;
    s.kind = ir::CollectiveKind::AllGather;
    produced.push_back(launch(s, flat(input), "all_gather_into_tensor"));
    put(output, produced.back(), local_);
  }
  return finish(OpType::_ALLGATHER_BASE, "all_gather_into_tensor", std::move(produced), {output});
}

WorkPtr DeviceTransport::allgather_coalesced(std::vector<TensorList>& outputs, TensorList& inputs,
                                             const c10d::AllgatherOptions&) {
  std::vector<runtime::BufferPtr> produced;
  TensorList results;
  for (size_t i = 0; i < inputs.size(); ++i) {
    results.insert(results.end(), outputs[i].begin(), outputs[i].end());
    if (inputs[i].numel() == 0) continue;
    ir::CollectiveSpec s;
    s.kind = ir::CollectiveKind::AllGather;
    produced.push_back(launch(s, flat(inputs[i]), "all_gather_coalesced"));
    put_pieces(outputs[i], produced.back(), local_, inputs[i].scalar_type());
  }
  return finish(OpType::ALLGATHER_COALESCED, "all_gather_coalesced", std::move(produced), results);
}

WorkPtr DeviceTransport::allgather_into_tensor_coalesced(TensorList& outputs, TensorList& inputs,
                                                         const c10d::AllgatherOptions&) {
  std::vector<runtime::BufferPtr> produced;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].numel() == 0) continue;
    ir::CollectiveSpec s;
    s.kind = ir::CollectiveKind::AllGather;
    produced.push_back(launch(s, flat(inputs[i]), "all_gather_into_tensor_coalesced"));
    put(outputs[i], produced.back(), local_);
  }
  return finish(OpType::COALESCED, "all_gather_into_tensor_coalesced", std::move(produced), outputs);
}

WorkPtr DeviceTransport::reduce_scatter(TensorList& outputs, std::vector<TensorList>& inputs,
                                        const c10d::ReduceScatterOptions& opts) {
  for (const at::Tensor& piece : inputs[0])  // ranks' pieces of other sizes: staged
    if (piece.numel() != outputs[0].numel()) return staged_->reduce_scatter(outputs, inputs, opts);
  std::vector<runtime::BufferPtr> produced;
  if (outputs[0].numel() > 0) {
    ir::CollectiveSpec s;
    s.kind = ir::CollectiveKind::ReduceScatter;
    s.reduce = reduce_kind(opts.reduceOp);
    produced.push_back(launch(s, flat_cat(inputs[0]), "reduce_scatter"));
    put(outputs[0], produced.back(), local_);
  }
  return finish(OpType::REDUCE_SCATTER, "reduce_scatter", std::move(produced), outputs);
}

WorkPtr DeviceTransport::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                              const c10d::ReduceScatterOptions& opts) {
  std::vector<runtime::BufferPtr> produced;
  if (output.numel() > 0) {
    ir::CollectiveSpec s;
    s.kind = ir::CollectiveKind::ReduceScatter;
    s.reduce = reduce_kind(opts.reduceOp);
    produced.push_back(launch(s, flat(input), "reduce_scatter_tensor"));
    put(output, produced.back(), local_);
  }
  return finish(OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", std::move(produced), {output});
}

WorkPtr DeviceTransport::reduce_scatter_tensor_coalesced(TensorList& outputs, TensorList& inputs,
                                                         const c10d::ReduceScatterOptions& opts) {
  std::vector<runtime::BufferPtr> produced;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (outputs[i].numel() == 0) continue;
    ir::CollectiveSpec s;
    s.kind = ir::CollectiveKind::ReduceScatter;
    s.reduce = reduce_kind(opts.reduceOp);
    produced.push_back(launch(s, flat(inputs[i]), "reduce_scatter_tensor_coalesced"));
    put(outputs[i], produced.back(), local_);
  }
  return finish(OpType::COALESCED, "reduce_scatter_tensor_coalesced", std::move(produced), outputs);
}

WorkPtr DeviceTransport::alltoall_base(at::Tensor& output, at::Tensor& input,
                                       std::vector<int64_t>& output_splits,
                                       std::vector<int64_t>& input_splits,
                                       const c10d::AllToAllOptions& opts) {
  // Even splits (none given, or all equal) are one all_to_all program; uneven ones have
  // no static-shape program and run host-staged.
  auto even = [](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v[0]; });
  };
  bool same = input.numel() == output.numel();
  if (!even(input_splits) || !even(output_splits) || !same || input.numel() % getSize() != 0)
    return staged_->alltoall_base(output, input, output_splits, input_splits, opts);
  std::vector<runtime::BufferPtr> produced;
  if (input.numel() > 0) {
    ir::CollectiveSpec s;
    s.kind = ir::CollectiveKind::AllToAll;
    produced.push_back(launch(s, flat(input), "all_to_all_single"));
    put(output, produced.back(), local_);
  }
  return finish(OpType::ALLTOALL_BASE, "all_to_all_single", std::move(produced), {output});
}

WorkPtr DeviceTransport::alltoall(TensorList& outputs, TensorList& inputs,
                                  const c10d::AllToAllOptions& opts) {
  bool equal = true;
  for (size_t i = 0; i < inputs.size(); ++i)
    equal = equal && inputs[i].numel() == inputs[0].numel() &&
            outputs[i].numel() == inputs[0].numel() &&
            inputs[i].scalar_type() == inputs[0].scalar_type() &&
            outputs[i].scalar_type() == inputs[0].scalar_type();
  if (!equal) return staged_->alltoall(outputs, inputs, opts);
  std::vector<runtime::BufferPtr> produced;
  if (inputs[0].numel() > 0) {
    ir::CollectiveSpec s;
    s.kind = ir::CollectiveKind::AllToAll;
    produced.push_back(launch(s, flat_cat(inputs), "all_to_all"));
    put_pieces(outputs, produced.back(), local_, inputs[0].scalar_type());
  }
  return finish(OpType::ALLTOALL, "all_to_all", std::move(produced), outputs);
}

WorkPtr DeviceTransport::gather(std::vector<TensorList>& outputs, TensorList& inputs,
                                const c10d::GatherOptions& opts) {
  return staged_->gather(outputs, inputs, opts);
}

WorkPtr DeviceTransport::scatter(TensorList& outputs, std::vector<TensorList>& inputs,
                                 const c10d::ScatterOptions& opts) {
  return staged_->scatter(outputs, inputs, opts);
}

WorkPtr DeviceTransport::send(TensorList& tensors, int dst, int tag) {
  return staged_->send(tensors, dst, tag);
}

WorkPtr DeviceTransport::recv(TensorList& tensors, int src, int tag) {
  return staged_->recv(tensors, src, tag);
}

WorkPtr DeviceTransport::recvAnysource(TensorList& tensors, int tag) {
  return staged_->recvAnysource(tensors, tag);
}

WorkPtr DeviceTransport::barrier(const c10d::BarrierOptions& opts) {
  return staged_->barrier(opts);
}

}  // namespace tpu::distributed
