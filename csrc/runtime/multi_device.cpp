#include "runtime/multi_device.h"

#include <algorithm>
#include <set>

#include "runtime/pjrt_args.h"
#include "runtime/proto_wire.h"

namespace tpu::runtime {
namespace {

using proto_wire::put_bytes_field;
using proto_wire::put_int_field;

int64_t id_of(const Client& c, PJRT_Device* d) {
  auto g = ARGS(PJRT_Device_GetDescription_Args);
  g.device = d;
  c.check(c.api()->PJRT_Device_GetDescription(&g), "PJRT_Device_GetDescription");
  auto a = ARGS(PJRT_DeviceDescription_Id_Args);
  a.device_description = g.device_description;
  c.check(c.api()->PJRT_DeviceDescription_Id(&a), "PJRT_DeviceDescription_Id");
  return a.id;
}

void destroy_error(const Client& c, PJRT_Error* e) {
  auto d = ARGS(PJRT_Error_Destroy_Args);
  d.error = e;
  c.api()->PJRT_Error_Destroy(&d);
}

// Owns `outs` (one program's outputs on one local device) as Buffers.
std::vector<BufferPtr> wrap_outputs(Client& c, PJRT_Buffer** outs, size_t n, int local,
                                    const std::shared_ptr<const std::string>& name) {
  std::vector<BufferPtr> result;
  for (size_t i = 0; i < n; ++i) {
    auto et = ARGS(PJRT_Buffer_ElementType_Args);
    et.buffer = outs[i];
    c.check(c.api()->PJRT_Buffer_ElementType(&et), "PJRT_Buffer_ElementType");
    auto dm = ARGS(PJRT_Buffer_Dimensions_Args);
    dm.buffer = outs[i];
    c.check(c.api()->PJRT_Buffer_Dimensions(&dm), "PJRT_Buffer_Dimensions");
    auto b = std::make_shared<Buffer>(outs[i], local, dtype_from_pjrt(et.type),
                                      std::vector<int64_t>(dm.dims, dm.dims + dm.num_dims));
    b->producer = name;
    result.push_back(std::move(b));
  }
  return result;
}

}  // namespace

int64_t global_device_id(const Client& c, int local) { return id_of(c, c.device(local)); }

std::vector<int64_t> all_global_device_ids(const Client& c) {
  auto a = ARGS(PJRT_Client_Devices_Args);
  a.client = c.raw_client();
  c.check(c.api()->PJRT_Client_Devices(&a), "PJRT_Client_Devices");
  std::vector<int64_t> ids;
  for (size_t i = 0; i < a.num_devices; ++i) ids.push_back(id_of(c, a.devices[i]));
  return ids;
}

int local_device_of(const Client& c, int64_t id) {
  for (int i = 0; i < c.device_count(); ++i)
    if (global_device_id(c, i) == id) return i;
  return -1;
}

std::string replicated_compile_options(const std::vector<int64_t>& device_ids) {
  const int64_t n = static_cast<int64_t>(device_ids.size());
  std::string computation;                      // DeviceAssignmentProto.ComputationDevice
  for (int64_t id : device_ids) put_int_field(computation, 1, id);  // replica_device_ids
  std::string assignment;                       // DeviceAssignmentProto
  put_int_field(assignment, 1, n);                    // replica_count
  put_int_field(assignment, 2, 1);                    // computation_count
  put_bytes_field(assignment, 3, computation);        // computation_devices
  std::string build;                            // ExecutableBuildOptionsProto
  put_int_field(build, 1, -1);                        // device_ordinal: unset
  put_int_field(build, 4, n);                         // num_replicas
  put_int_field(build, 5, 1);                         // num_partitions
  put_bytes_field(build, 9, assignment);              // device_assignment
  std::string opts;                             // CompileOptionsProto
  put_bytes_field(opts, 3, build);                    // executable_build_options
  // compile_portable_executable stays false: the program is bound to these devices.
  return opts;
}

ReplicatedExecutable::ReplicatedExecutable(PJRT_LoadedExecutable* e, std::vector<int64_t> ids,
                                           size_t num_outputs, std::string name)
    : exe_(e), ids_(std::move(ids)), num_outputs_(num_outputs), name_(std::move(name)) {}

ReplicatedExecutable::~ReplicatedExecutable() {
  if (!exe_ || !Client::initialized() || Client::forked_after_init()) return;
  Client& c = Client::get();
  auto a = ARGS(PJRT_LoadedExecutable_Destroy_Args);
  a.executable = exe_;
  if (PJRT_Error* e = c.api()->PJRT_LoadedExecutable_Destroy(&a)) destroy_error(c, e);
}

ReplicatedPtr compile_replicated(Client& c, const std::string& mlir,
                                 const std::vector<int64_t>& device_ids, const std::string& name) {
  std::vector<int64_t> known = all_global_device_ids(c);
  std::set<int64_t> seen;
  for (int64_t id : device_ids) {
    bool ok = std::find(known.begin(), known.end(), id) != known.end();
    if (!ok || !seen.insert(id).second)
      throw Error("compiling " + name + ": device id " + std::to_string(id) +
                      (ok ? " is assigned to two replicas" : " is not a device of the " +
                                c.platform() + " client (it sees " +
                                std::to_string(known.size()) + " devices)"),
                  PJRT_Error_Code_INVALID_ARGUMENT);
  }
  std::string options = replicated_compile_options(device_ids);
  static const char kFormat[] = "mlir";
  auto prog = ARGS(PJRT_Program);
  prog.code = const_cast<char*>(mlir.data());
  prog.code_size = mlir.size();
  prog.format = kFormat;
  prog.format_size = 4;
  auto a = ARGS(PJRT_Client_Compile_Args);
  a.client = c.raw_client();
  a.program = &prog;
  a.compile_options = options.data();
  a.compile_options_size = options.size();
  c.check(c.api()->PJRT_Client_Compile(&a), "compiling " + name);
  c.counters().compiles += 1;

  auto ge = ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  ge.loaded_executable = a.executable;
  c.check(c.api()->PJRT_LoadedExecutable_GetExecutable(&ge), "GetExecutable");
  auto no = ARGS(PJRT_Executable_NumOutputs_Args);
  no.executable = ge.executable;
  PJRT_Error* err = c.api()->PJRT_Executable_NumOutputs(&no);
  auto de = ARGS(PJRT_Executable_Destroy_Args);
  de.executable = ge.executable;
  c.api()->PJRT_Executable_Destroy(&de);
  auto exe = std::make_shared<ReplicatedExecutable>(a.executable, device_ids, no.num_outputs, name);
  c.check(err, "NumOutputs");

  // The order the executable takes argument lists in: its addressable devices.
  auto ad = ARGS(PJRT_LoadedExecutable_AddressableDevices_Args);
  ad.executable = a.executable;
  c.check(c.api()->PJRT_LoadedExecutable_AddressableDevices(&ad), "AddressableDevices");
  for (size_t i = 0; i < ad.num_addressable_devices; ++i) {
    int64_t id = id_of(c, ad.addressable_devices[i]);
    auto it = std::find(device_ids.begin(), device_ids.end(), id);
    if (it == device_ids.end())
      throw Error("compiling " + name + ": the executable runs on device " + std::to_string(id) +
                      ", which it was not assigned", PJRT_Error_Code_INTERNAL);
    exe->local_replicas_.push_back(static_cast<int>(it - device_ids.begin()));
  }
  return exe;
}

std::vector<std::vector<BufferPtr>> execute_replicated(Client& c, const ReplicatedExecutable& exe,
                                                       const std::vector<std::vector<Buffer*>>& args) {
  const std::vector<int>& local = exe.local_replicas();
  if (local.empty())
    throw Error("executing " + exe.name() + ": no replica runs in this process",
                PJRT_Error_Code_INVALID_ARGUMENT);
  if (static_cast<int>(args.size()) != exe.num_replicas())
    throw Error("executing " + exe.name() + ": " + std::to_string(args.size()) +
                    " argument lists for " + std::to_string(exe.num_replicas()) + " replicas",
                PJRT_Error_Code_INVALID_ARGUMENT);
  const size_t nargs = args[local[0]].size();
  std::vector<std::vector<PJRT_Buffer*>> raw(local.size());
  std::vector<PJRT_Buffer* const*> arg_lists;
  std::vector<std::vector<PJRT_Buffer*>> outs(local.size(),
                                              std::vector<PJRT_Buffer*>(exe.num_outputs()));
  std::vector<PJRT_Buffer**> out_lists;
  std::vector<int> devices;  // local device index of each launched replica
  for (size_t i = 0; i < local.size(); ++i) {
    const std::vector<Buffer*>& a = args[local[i]];
    if (a.size() != nargs)
      throw Error("executing " + exe.name() + ": replicas take " + std::to_string(nargs) +
                      " arguments each", PJRT_Error_Code_INVALID_ARGUMENT);
    int dev = local_device_of(c, exe.device_ids()[local[i]]);
    for (Buffer* b : a) {
      if (b->device() != dev)
        throw Error("executing " + exe.name() + ": replica " + std::to_string(local[i]) +
                        " runs on tpu:" + std::to_string(dev) + " but its argument is on tpu:" +
                        std::to_string(b->device()), PJRT_Error_Code_INVALID_ARGUMENT);
      raw[i].push_back(b->raw());
    }
    arg_lists.push_back(raw[i].data());
    out_lists.push_back(outs[i].data());
    devices.push_back(dev);
  }
  std::vector<PJRT_Event*> done(local.size(), nullptr);
  auto opts = ARGS(PJRT_ExecuteOptions);
  std::vector<int64_t> keep(nargs);  // nothing is donated
  for (size_t i = 0; i < nargs; ++i) keep[i] = static_cast<int64_t>(i);
  opts.non_donatable_input_indices = keep.data();
  opts.num_non_donatable_input_indices = nargs;
  auto x = ARGS(PJRT_LoadedExecutable_Execute_Args);
  x.executable = exe.raw();
  x.options = &opts;
  x.argument_lists = arg_lists.data();
  x.num_devices = local.size();
  x.num_args = nargs;
  x.output_lists = out_lists.data();
  x.device_complete_events = done.data();
  c.check(c.api()->PJRT_LoadedExecutable_Execute(&x), "executing " + exe.name());
  c.counters().executions += 1;
  auto name = std::make_shared<const std::string>(exe.name());
  std::vector<std::vector<BufferPtr>> result(exe.num_replicas());
  for (size_t i = 0; i < local.size(); ++i) {
    result[local[i]] = wrap_outputs(c, outs[i].data(), exe.num_outputs(), devices[i], name);
    if (done[i]) c.track_launch(done[i], devices[i], name);
  }
  return result;
}

std::vector<BufferPtr> execute_replica(Client& c, const ReplicatedExecutable& exe, int replica,
                                       const std::vector<Buffer*>& args) {
  if (replica < 0 || replica >= exe.num_replicas())
    throw Error("executing " + exe.name() + ": no replica " + std::to_string(replica),
                PJRT_Error_Code_INVALID_ARGUMENT);
  int dev = local_device_of(c, exe.device_ids()[replica]);
  if (dev < 0)
    throw Error("executing " + exe.name() + ": replica " + std::to_string(replica) +
                    "'s device " + std::to_string(exe.device_ids()[replica]) +
                    " is not addressable from this process", PJRT_Error_Code_INVALID_ARGUMENT);
  std::vector<PJRT_Buffer*> raw;
  for (Buffer* b : args) {
    if (b->device() != dev)
      throw Error("executing " + exe.name() + ": replica " + std::to_string(replica) +
                      " runs on tpu:" + std::to_string(dev) + " but its argument is on tpu:" +
                      std::to_string(b->device()), PJRT_Error_Code_INVALID_ARGUMENT);
    raw.push_back(b->raw());
  }
  std::vector<PJRT_Buffer*> outs(exe.num_outputs());
  PJRT_Buffer* const* arg_lists[1] = {raw.data()};
  PJRT_Buffer** out_lists[1] = {outs.data()};
  PJRT_Event* done[1] = {nullptr};
  auto opts = ARGS(PJRT_ExecuteOptions);
  std::vector<int64_t> keep(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) keep[i] = static_cast<int64_t>(i);
  opts.non_donatable_input_indices = keep.data();
  opts.num_non_donatable_input_indices = keep.size();
  auto x = ARGS(PJRT_LoadedExecutable_Execute_Args);
  x.executable = exe.raw();
  x.options = &opts;
  x.argument_lists = arg_lists;
  x.num_devices = 1;
  x.num_args = raw.size();
  x.output_lists = out_lists;
  x.device_complete_events = done;
  x.execute_device = c.device(dev);
  c.check(c.api()->PJRT_LoadedExecutable_Execute(&x), "executing " + exe.name());
  c.counters().executions += 1;
  auto name = std::make_shared<const std::string>(exe.name());
  std::vector<BufferPtr> result = wrap_outputs(c, outs.data(), exe.num_outputs(), dev, name);
  if (done[0]) c.track_launch(done[0], dev, name);
  return result;
}

void await_ready(Client& c, const Buffer& b) {
  auto r = ARGS(PJRT_Buffer_ReadyEvent_Args);
  r.buffer = b.raw();
  c.check(c.api()->PJRT_Buffer_ReadyEvent(&r), "PJRT_Buffer_ReadyEvent");
  auto w = ARGS(PJRT_Event_Await_Args);
  w.event = r.event;
  PJRT_Error* err = c.api()->PJRT_Event_Await(&w);
  auto d = ARGS(PJRT_Event_Destroy_Args);
  d.event = r.event;
  c.api()->PJRT_Event_Destroy(&d);
  c.check(err, "executing " + (b.producer ? *b.producer : std::string("a program")));
}

}  // namespace tpu::runtime
