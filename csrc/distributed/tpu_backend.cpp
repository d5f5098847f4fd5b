#include "distributed/tpu_backend.h"

#include <algorithm>
#include <string>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "distributed/checks.h"
#include "distributed/transport.h"

namespace tpu::distributed {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using TensorList = std::vector<at::Tensor>;

namespace {

// The works of the collectives issued between startCoalescing and endCoalescing (c10d's
// _coalescing_manager with a device), waited for as one.
class CoalescedWork final : public c10d::Work {
 public:
  explicit CoalescedWork(std::vector<WorkPtr> works) : works_(std::move(works)) {}
  bool isCompleted() override {
    for (auto& w : works_)
      if (!w->isCompleted()) return false;
    return true;
  }
  bool isSuccess() const override {
    for (auto& w : works_)
      if (!w->isSuccess()) return false;
    return true;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    for (auto& w : works_) w->wait(timeout);
    return true;
  }
  void synchronize() override {
    for (auto& w : works_) w->synchronize();
  }

 private:
  std::vector<WorkPtr> works_;
};

}  // namespace

void TpuBackend::startCoalescing() {
  TORCH_CHECK(!coalescing_, "tpu_dist: startCoalescing() while already coalescing");
  coalescing_.emplace();
}

WorkPtr TpuBackend::endCoalescing() {
  TORCH_CHECK(coalescing_, "tpu_dist: endCoalescing() without startCoalescing()");
  std::vector<WorkPtr> works = std::move(*coalescing_);
  coalescing_.reset();
  return c10::make_intrusive<CoalescedWork>(std::move(works));
}

WorkPtr TpuBackend::issued(WorkPtr work) {
  if (coalescing_ && work) coalescing_->push_back(work);
  return work;
}

TpuBackend::TpuBackend(c10::intrusive_ptr<c10d::Backend> host, const std::string& transport,
                       std::chrono::milliseconds timeout, c10::intrusive_ptr<c10d::Store> store)
    : c10d::Backend(host->getRank(), host->getSize()), timeout_(timeout), store_(std::move(store)) {
  transport_ = choose_transport(std::move(host), transport, &transport_name_);
}

namespace {
GroupFactory& group_factory() {
  static GroupFactory factory;
  return factory;
}
}  // namespace

void set_group_factory(GroupFactory factory) { group_factory() = std::move(factory); }

c10::intrusive_ptr<c10d::Backend> TpuBackend::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  // Every rank refuses a bad rank alike (members would otherwise wait for it to join).
  for (int r : ranks) check_rank("split_group", r, getSize(), "split");
  int64_t split = splits_++;
  auto me = std::find(ranks.begin(), ranks.end(), getRank());
  // Not a member: nothing to join. Unlike ncclCommSplit, making the new group's backend
  // takes only its members.
  if (me == ranks.end()) return nullptr;
  const GroupFactory& factory = group_factory();
  TORCH_CHECK(factory, "tpu_dist: split_group needs torch_tpu's process-group factory, which "
              "importing torch_tpu installs");
  // The members meet under this group's store, at a key from this split's number and
  // ranks. c10d's `store` is prefixed with the new group's name, which split_group hashes
  // from how many groups the process has: after a split that left some ranks out, that
  // count differs between ranks and members would wait on different keys (NCCL's split
  // does not meet on the store).
  c10::intrusive_ptr<c10d::Store> meet = store;
  if (store_) {
    std::string key = "tpu_dist/split" + std::to_string(split) + "/";
    for (size_t i = 0; i < ranks.size(); ++i) key += (i ? "," : "") + std::to_string(ranks[i]);
    meet = c10::make_intrusive<c10d::PrefixStore>(key + "/", store_->clone());
  }
  return factory(meet, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()),
                 opts ? opts->timeout : timeout_);
}

WorkPtr TpuBackend::broadcast(TensorList& tensors, const c10d::BroadcastOptions& opts) {
  check_tpu("broadcast", tensors);
  check_writable("broadcast", tensors);
  check_rank("broadcast", static_cast<int>(opts.rootRank), getSize(), "source");
  return issued(transport_->broadcast(tensors, opts));
}

WorkPtr TpuBackend::allreduce(TensorList& tensors, const c10d::AllreduceOptions& opts) {
  check_tpu("all_reduce", tensors);
  check_writable("all_reduce", tensors);
  check_reduce_op("all_reduce", opts.reduceOp, tensors);
  return issued(transport_->allreduce(tensors, opts));
}

WorkPtr TpuBackend::allreduce_coalesced(TensorList& tensors,
                                        const c10d::AllreduceCoalescedOptions& opts) {
  check_tpu("all_reduce_coalesced", tensors);
  check_writable("all_reduce_coalesced", tensors);
  check_reduce_op("all_reduce_coalesced", opts.reduceOp, tensors);
  return issued(transport_->allreduce_coalesced(tensors, opts));
}

WorkPtr TpuBackend::reduce(TensorList& tensors, const c10d::ReduceOptions& opts) {
  check_tpu("reduce", tensors);
  check_writable("reduce", tensors);
  check_reduce_op("reduce", opts.reduceOp, tensors);
  check_rank("reduce", static_cast<int>(opts.rootRank), getSize(), "destination");
  return issued(transport_->reduce(tensors, opts));
}

WorkPtr TpuBackend::allgather(std::vector<TensorList>& outputs, TensorList& inputs,
                              const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1, "distributed.all_gather(): ",
                    "tpu_dist takes one input tensor and one output list per process, got ",
                    inputs.size(), " inputs and ", outputs.size(), " output lists");
  check_tpu("all_gather", inputs, "input ");
  check_tpu("all_gather", outputs[0], "output ");
  check_writable("all_gather", outputs[0], "output ");
  check_per_rank("all_gather", outputs[0], getSize(), "output");
  check_pieces("all_gather", outputs[0], inputs[0], getRank(), "output");
  return issued(transport_->allgather(outputs, inputs, opts));
}

WorkPtr TpuBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                    const c10d::AllgatherOptions& opts) {
  check_tpu("all_gather_into_tensor", {output, input});
  check_writable("all_gather_into_tensor", {output}, "output ");
  check_times("all_gather_into_tensor", output, input, getSize(), "output", "input");
  return issued(transport_->_allgather_base(output, input, opts));
}

WorkPtr TpuBackend::allgather_coalesced(std::vector<TensorList>& outputs, TensorList& inputs,
                                        const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "distributed.all_gather_coalesced(): ",
                    "got ", outputs.size(), " output lists for ", inputs.size(), " inputs");
  check_tpu("all_gather_coalesced", inputs, "input ");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tpu("all_gather_coalesced", outputs[i], "output ");
    check_writable("all_gather_coalesced", outputs[i], "output ");
    check_per_rank("all_gather_coalesced", outputs[i], getSize(), "output");
    check_same("all_gather_coalesced", outputs[i], inputs[i], "output");
  }
  return issued(transport_->allgather_coalesced(outputs, inputs, opts));
}

WorkPtr TpuBackend::allgather_into_tensor_coalesced(TensorList& outputs, TensorList& inputs,
                                                    const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor_coalesced";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "distributed.", op, "(): got ",
                    outputs.size(), " outputs for ", inputs.size(), " inputs");
  check_tpu(op, inputs, "input ");
  check_tpu(op, outputs, "output ");
  check_writable(op, outputs, "output ");
  for (size_t i = 0; i < inputs.size(); ++i)
    check_times(op, outputs[i], inputs[i], getSize(), "output", "input");
  return issued(transport_->allgather_into_tensor_coalesced(outputs, inputs, opts));
}

WorkPtr TpuBackend::gather(std::vector<TensorList>& outputs, TensorList& inputs,
                           const c10d::GatherOptions& opts) {
  check_rank("gather", static_cast<int>(opts.rootRank), getSize(), "destination");
  TORCH_CHECK_VALUE(inputs.size() == 1, "distributed.gather(): tpu_dist takes one input ",
                    "tensor, got ", inputs.size());
  check_tpu("gather", inputs, "input ");
  if (getRank() == opts.rootRank) {
    TORCH_CHECK_VALUE(outputs.size() == 1, "distributed.gather(): the destination needs one ",
                      "output list, got ", outputs.size());
    check_tpu("gather", outputs[0], "output ");
    check_writable("gather", outputs[0], "output ");
    check_per_rank("gather", outputs[0], getSize(), "output");
    check_same("gather", outputs[0], inputs[0], "output");
  }
  return issued(transport_->gather(outputs, inputs, opts));
}

WorkPtr TpuBackend::scatter(TensorList& outputs, std::vector<TensorList>& inputs,
                            const c10d::ScatterOptions& opts) {
  check_rank("scatter", static_cast<int>(opts.rootRank), getSize(), "source");
  TORCH_CHECK_VALUE(outputs.size() == 1, "distributed.scatter(): tpu_dist takes one output ",
                    "tensor, got ", outputs.size());
  check_tpu("scatter", outputs, "output ");
  check_writable("scatter", outputs, "output ");
  if (getRank() == opts.rootRank) {
    TORCH_CHECK_VALUE(inputs.size() == 1, "distributed.scatter(): the source needs one input ",
                      "list, got ", inputs.size());
    check_tpu("scatter", inputs[0], "input ");
    check_per_rank("scatter", inputs[0], getSize(), "input");
    check_same("scatter", inputs[0], outputs[0], "input");
  }
  return issued(transport_->scatter(outputs, inputs, opts));
}

WorkPtr TpuBackend::reduce_scatter(TensorList& outputs, std::vector<TensorList>& inputs,
                                   const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1, "distributed.reduce_scatter(): ",
                    "tpu_dist takes one output tensor and one input list per process");
  check_tpu("reduce_scatter", outputs, "output ");
  check_writable("reduce_scatter", outputs, "output ");
  check_tpu("reduce_scatter", inputs[0], "input ");
  check_per_rank("reduce_scatter", inputs[0], getSize(), "input");
  check_pieces("reduce_scatter", inputs[0], outputs[0], getRank(), "input");
  check_reduce_op("reduce_scatter", opts.reduceOp, outputs);
  return issued(transport_->reduce_scatter(outputs, inputs, opts));
}

WorkPtr TpuBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                         const c10d::ReduceScatterOptions& opts) {
  check_tpu("reduce_scatter_tensor", {output, input});
  check_writable("reduce_scatter_tensor", {output}, "output ");
  check_times("reduce_scatter_tensor", input, output, getSize(), "input", "output");
  check_reduce_op("reduce_scatter_tensor", opts.reduceOp, {output});
  return issued(transport_->_reduce_scatter_base(output, input, opts));
}

WorkPtr TpuBackend::reduce_scatter_tensor_coalesced(TensorList& outputs, TensorList& inputs,
                                                    const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "distributed.", op, "(): got ",
                    outputs.size(), " outputs for ", inputs.size(), " inputs");
  check_tpu(op, inputs, "input ");
  check_tpu(op, outputs, "output ");
  check_writable(op, outputs, "output ");
  for (size_t i = 0; i < inputs.size(); ++i)
    check_times(op, inputs[i], outputs[i], getSize(), "input", "output");
  check_reduce_op(op, opts.reduceOp, outputs);
  return issued(transport_->reduce_scatter_tensor_coalesced(outputs, inputs, opts));
}

WorkPtr TpuBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                  std::vector<int64_t>& output_splits,
                                  std::vector<int64_t>& input_splits,
                                  const c10d::AllToAllOptions& opts) {
  check_tpu("all_to_all_single", {output, input});
  check_writable("all_to_all_single", {output}, "output ");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "distributed.all_to_all_single(): ",
                   "output ", describe(output), " and input ", describe(input), " differ in dtype");
  check_splits("all_to_all_single", input, input_splits, getSize(), "input");
  check_splits("all_to_all_single", output, output_splits, getSize(), "output");
  return issued(transport_->alltoall_base(output, input, output_splits, input_splits, opts));
}

WorkPtr TpuBackend::alltoall(TensorList& outputs, TensorList& inputs,
                             const c10d::AllToAllOptions& opts) {
  check_tpu("all_to_all", inputs, "input ");
  check_tpu("all_to_all", outputs, "output ");
  check_writable("all_to_all", outputs, "output ");
  check_per_rank("all_to_all", inputs, getSize(), "input");
  check_per_rank("all_to_all", outputs, getSize(), "output");
  return issued(transport_->alltoall(outputs, inputs, opts));
}

WorkPtr TpuBackend::send(TensorList& tensors, int dst, int tag) {
  check_tpu("send", tensors);
  check_rank("send", dst, getSize(), "destination", getRank());
  return issued(transport_->send(tensors, dst, tag));
}

WorkPtr TpuBackend::recv(TensorList& tensors, int src, int tag) {
  check_tpu("recv", tensors);
  check_writable("recv", tensors);
  check_rank("recv", src, getSize(), "source", getRank());
  return issued(transport_->recv(tensors, src, tag));
}

WorkPtr TpuBackend::recvAnysource(TensorList& tensors, int tag) {
  check_tpu("recv", tensors);
  check_writable("recv", tensors);
  return issued(transport_->recvAnysource(tensors, tag));
}

WorkPtr TpuBackend::barrier(const c10d::BarrierOptions& opts) { return issued(transport_->barrier(opts)); }

}  // namespace tpu::distributed
