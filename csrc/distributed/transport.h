// How a collective's bytes move between processes. A transport is itself a c10d
// Backend over tpu tensors (same collectives, same options); TpuBackend checks the
// arguments and hands them to the transport `choose_transport` picks:
//  - host-staged: device -> host copies, the collective on a CPU c10d backend (Gloo),
//    host -> device copies into the tpu tensors (host_staged.h);
//  - device collectives: each collective one StableHLO program with a replica per rank
//    (device_collectives.h), for plugins whose client spans the group's processes (every
//    rank's device a distinct device of one client). The XLA CPU plugin's does not
//    ("Multiprocess computations aren't implemented on the CPU backend"): there it runs
//    only groups of one process, and asking for it with more is an error naming why.
#pragma once
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace tpu::distributed {

// `host` is the CPU backend (Gloo) the host-staged transport runs collectives on.
// `requested`: "" / "auto" picks from what the plugin reports (device where the client
// spans processes and can run the group); "host" or "device" force.
c10::intrusive_ptr<c10d::Backend> choose_transport(c10::intrusive_ptr<c10d::Backend> host,
                                                   const std::string& requested,
                                                   std::string* chosen);

}  // namespace tpu::distributed
