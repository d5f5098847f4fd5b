// `tpu_dist`: the c10d backend for tpu tensors. It checks each collective's arguments
// (errors name the collective, shapes and ranks) and runs it on a transport
// (transport.h). One process per device, as with NCCL.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <vector>

namespace tpu::distributed {

// The options a tpu_dist backend reports. c10d's split_group deep-copies the parent's and
// hands the copy to split(); Python can copy this type (python.cpp), not c10d's own.
struct TpuBackendOptions : c10d::Backend::Options {
  explicit TpuBackendOptions(std::chrono::milliseconds timeout)
      : c10d::Backend::Options("tpu_dist", timeout) {}
};

// Makes the tpu_dist backend of a new group: `rank` of `size` processes meeting on
// `store`. torch_tpu's c10d factory (the one init_process_group and new_group call)
// installs itself here, so split() makes its groups the same way.
using GroupFactory = std::function<c10::intrusive_ptr<c10d::Backend>(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout)>;
void set_group_factory(GroupFactory factory);

class TpuBackend : public c10d::Backend {
 public:
  // `host`: a CPU backend over the same store (Gloo); `transport`: "", "auto", "host",
  // "device" (see choose_transport).
  // `store`: the one the group's processes met on (its splits meet under it); none: they
  // meet on the store c10d gives split().
  TpuBackend(c10::intrusive_ptr<c10d::Backend> host, const std::string& transport,
             std::chrono::milliseconds timeout = kBackendDefaultTimeout,
             c10::intrusive_ptr<c10d::Store> store = {});
  const std::string getBackendName() const override { return "tpu_dist"; }
  const std::string& transport_name() const { return transport_name_; }
  const c10::intrusive_ptr<c10d::Backend>& transport() const { return transport_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void setTimeout(std::chrono::milliseconds timeout) override {
    timeout_ = timeout;
    transport_->setTimeout(timeout);
  }
  // A copy: c10d's splitGroup writes the child's name and timeout into what it is given.
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override {
    return c10::make_intrusive<TpuBackendOptions>(timeout_);
  }
  // dist.split_group (and DeviceMesh when the default group has a device_id, as CUDA
  // scripts give NCCL): the ranks of `ranks` in this group get a new tpu_dist backend,
  // made by the group factory; the others get none (nullptr). Every rank of this group
  // calls it, in the same order (split_group's rule).
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  // Every collective runs one on the transport's group: its count numbers ours too
  // (c10d's ProcessGroupWrapper and flight recorder ask for it).
  void setSequenceNumberForGroup() override { transport_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return transport_->getSequenceNumberForGroup(); }
  // c10d's _coalescing_manager(group, device): the collectives issued in between run as
  // they are issued; endCoalescing's work waits for all of them.
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

 private:
  c10::intrusive_ptr<c10d::Work> issued(c10::intrusive_ptr<c10d::Work> work);
  std::optional<std::vector<c10::intrusive_ptr<c10d::Work>>> coalescing_;
  c10::intrusive_ptr<c10d::Backend> transport_;
  std::string transport_name_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  int64_t splits_ = 0;  // split() calls so far: the same count on every rank
};

}  // namespace tpu::distributed
