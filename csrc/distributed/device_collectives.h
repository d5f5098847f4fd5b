// The device transport: each collective is one StableHLO program (ir/collectives.h)
// with one replica per rank, replica r on rank r's device, compiled once per
// (collective, shape, dtype, group) and launched by every rank on its own device
// (runtime/multi_device.h: execute_replica). The collective's data never leaves the
// devices. It needs a PJRT client that spans the group's processes (each rank's device
// a distinct device of one client: TPU slices through libtpu); the XLA CPU plugin's
// client does not, so there only a group of one process can use it.
//
// Results are written into the tpu tensors at once as promises (buffers the program
// fills); the Work completes when the program has run. Collectives without a program
// here (gather, scatter, send/recv, all_to_all with uneven splits, barrier) run on the
// host-staged transport, named in the README.
#pragma once
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "distributed/host_staged.h"
#include "distributed/staged_work.h"
#include "ir/collectives.h"
#include "runtime/multi_device.h"

namespace tpu::distributed {

// Why the device transport cannot run a group whose rank r uses the device with global
// id ids[r], on this process's client; empty when it can.
std::string device_transport_blocker(const std::vector<int64_t>& ids);

class DeviceTransport : public c10d::Backend {
 public:
  // `host`: the CPU backend for what has no device program. `ids`: each rank's global
  // device id; `local`: this rank's device (an index of this process's devices).
  DeviceTransport(c10::intrusive_ptr<c10d::Backend> host, std::vector<int64_t> ids, int local);
  ~DeviceTransport() override;
  const std::string getBackendName() const override { return "tpu_dist(device)"; }
  // Programs this transport used (one per collective, shape, dtype and group; compiled
  // once per process, shared by groups over the same devices).
  size_t num_programs();

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
  void setTimeout(std::chrono::milliseconds timeout) override { host_->setTimeout(timeout); }
  void setSequenceNumberForGroup() override { host_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return host_->getSequenceNumberForGroup(); }

 private:
  // Runs `s` (its dtype and shape taken from `operand`) on this rank's device; returns
  // this rank's result, a buffer the program fills.
  runtime::BufferPtr launch(ir::CollectiveSpec s, const at::Tensor& operand, const char* what);
  // The Work of one collective: done when its programs' results are.
  c10::intrusive_ptr<c10d::Work> finish(c10d::OpType op, const char* what,
                                        std::vector<runtime::BufferPtr> produced,
                                        std::vector<at::Tensor> results);

  c10::intrusive_ptr<c10d::Backend> host_;
  c10::intrusive_ptr<HostStagedTransport> staged_;  // collectives without a program here
  std::vector<int64_t> ids_;
  int local_;
  std::mutex mu_;
  std::unordered_map<std::string, runtime::ReplicatedPtr> programs_;
  std::shared_ptr<Sequencer> sequencer_;
};

}  // namespace tpu::distributed
