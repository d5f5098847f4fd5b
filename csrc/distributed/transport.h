// How a collective's bytes move between processes. A transport is itself a c10d
// Backend over tpu tensors (same collectives, same options); TpuBackend checks the
// arguments and hands them to the transport `choose_transport` picks:
//  - host-staged: device -> host copies, the collective on a CPU c10d backend (Gloo),
//    host -> device copies into the tpu tensors (host_staged.h);
//  - device collectives: StableHLO collectives across processes, for plugins whose
//    client spans processes. The XLA CPU plugin does not ("Multiprocess computations
//    aren't implemented on the CPU backend"), so this one is not written yet and asking
//    for it is an error.
#pragma once
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace tpu::distributed {

// `host` is the CPU backend (Gloo) the host-staged transport runs collectives on.
// `requested`: "" / "auto" picks from what the plugin reports; "host" or "device" force.
c10::intrusive_ptr<c10d::Backend> choose_transport(c10::intrusive_ptr<c10d::Backend> host,
                                                   const std::string& requested,
                                                   std::string* chosen);

}  // namespace tpu::distributed
