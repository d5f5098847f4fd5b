// Programs that run on several devices at once (one replica per device), the way
// collectives run: compiled with num_replicas = N and a device assignment over global
// device ids, then launched either on every replica this process can address (one
// argument list per device, one result list per device) or on one replica only (each
// process of a multi-process client launches its own). Decided from what the client
// reports (device ids, addressable devices), never from the plugin's name.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/client.h"

namespace tpu::runtime {

// The global id (PJRT_DeviceDescription_Id) of addressable device `local`.
int64_t global_device_id(const Client& c, int local);
// The ids of every device the client sees, in the client's order (other processes' too).
std::vector<int64_t> all_global_device_ids(const Client& c);
// The local index of the addressable device with global id `id`, or -1 (not in this process).
int local_device_of(const Client& c, int64_t id);

// A serialized CompileOptionsProto for `device_ids.size()` replicas, replica r on the
// device with global id device_ids[r], one partition.
std::string replicated_compile_options(const std::vector<int64_t>& device_ids);

class ReplicatedExecutable {
 public:
  ReplicatedExecutable(PJRT_LoadedExecutable* e, std::vector<int64_t> device_ids,
                       size_t num_outputs, std::string name);
  ~ReplicatedExecutable();
  ReplicatedExecutable(const ReplicatedExecutable&) = delete;
  ReplicatedExecutable& operator=(const ReplicatedExecutable&) = delete;
  PJRT_LoadedExecutable* raw() const { return exe_; }
  const std::vector<int64_t>& device_ids() const { return ids_; }  // by replica
  int num_replicas() const { return static_cast<int>(ids_.size()); }
  size_t num_outputs() const { return num_outputs_; }
  const std::string& name() const { return name_; }
  // Replicas whose device this process addresses, in the order the executable takes
  // their argument lists.
  const std::vector<int>& local_replicas() const { return local_replicas_; }

 private:
  friend std::shared_ptr<ReplicatedExecutable> compile_replicated(Client&, const std::string&,
                                                                  const std::vector<int64_t>&,
                                                                  const std::string&);
  PJRT_LoadedExecutable* exe_;
  std::vector<int64_t> ids_;
  size_t num_outputs_;
  std::string name_;
  std::vector<int> local_replicas_;
};
using ReplicatedPtr = std::shared_ptr<ReplicatedExecutable>;

// Compiles `mlir` (whose module says mhlo.num_replicas = device_ids.size()) for those
// devices. Every id must be a device the client sees, each once.
ReplicatedPtr compile_replicated(Client& c, const std::string& mlir,
                                 const std::vector<int64_t>& device_ids, const std::string& name);

// Launches every replica this process addresses: args[r] is replica r's argument list
// (entries for replicas of other processes are ignored). Returns each local replica's
// outputs (empty lists for the others). Asynchronous: the buffers are ready when their
// values are; torch.tpu.synchronize() waits for the launch.
std::vector<std::vector<BufferPtr>> execute_replicated(Client& c, const ReplicatedExecutable& exe,
                                                       const std::vector<std::vector<Buffer*>>& args);
// Launches replica `replica` alone, on its (addressable) device. The other replicas'
// processes (or this one, later) must launch theirs, or the collectives inside never finish.
std::vector<BufferPtr> execute_replica(Client& c, const ReplicatedExecutable& exe, int replica,
                                       const std::vector<Buffer*>& args);

// Waits until `b`'s value is ready; raises the producing program's error.
void await_ready(Client& c, const Buffer& b);

}  // namespace tpu::runtime
