// The host-staged transport: each collective runs on the CPU backend (Gloo)
// asynchronously over host tensors, and the thread that finishes it puts the results into
// the tpu tensors (reading a tpu tensor is a materialization point: pending deferred work
// runs first).
// - Where the plugin reports that its buffers live in host memory (runtime/host_address.h),
//   Gloo reads inputs in place; a result whose tensor's buffer nothing else holds, on an
//   idle device, is written into that buffer itself (all_reduce then copies nothing);
//   other values are copied by one memcpy into reused staging memory and written back
//   without a copy (the device buffer is made over the host memory; staged_work.h).
// - Elsewhere the plugin copies values to and from the host. all_reduce and
//   reduce_scatter_tensor of 2 chunks or more go chunk by chunk, so the copies overlap
//   Gloo's work on earlier chunks.
#pragma once
#include <memory>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "distributed/host_pool.h"
#include "distributed/staged_work.h"
#include "runtime/client.h"

namespace tpu::distributed {

class HostStagedTransport : public c10d::Backend {
 public:
  explicit HostStagedTransport(c10::intrusive_ptr<c10d::Backend> host);
  ~HostStagedTransport() override;  // completes the collectives still in flight
  const std::string getBackendName() const override { return "tpu_dist(host-staged)"; }

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
  // Collects one collective's transport Works and write-backs, then issues its Work.
  struct Staging;
  c10::intrusive_ptr<c10d::Work> finish(Staging& s, c10d::OpType op, const char* what,
                                        std::vector<at::Tensor> results);

  c10::intrusive_ptr<c10d::Backend> host_;
  // Large collectives go to the host in chunks of this many bytes (TPU_DIST_CHUNK_BYTES).
  int64_t chunk_bytes_;
  // Where the plugin reports that device buffers live in host memory, inputs are read
  // there in place (no transfer); TPU_DIST_HOST_ADDRESSES=0 copies as on other plugins.
  bool host_addresses_;
  HostPool pool_;
  std::shared_ptr<Sequencer> sequencer_;
};

// How many tensors collectives wrote in place so far (this process).
int64_t collective_writes_in_place();

}  // namespace tpu::distributed
