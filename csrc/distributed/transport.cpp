#include "distributed/transport.h"

#include <c10/util/Exception.h>

#include "distributed/host_staged.h"
#include "runtime/client.h"

namespace tpu::distributed {

c10::intrusive_ptr<c10d::Backend> choose_transport(c10::intrusive_ptr<c10d::Backend> host,
                                                   const std::string& requested,
                                                   std::string* chosen) {
  TORCH_CHECK_VALUE(requested.empty() || requested == "auto" || requested == "host" ||
                        requested == "device",
                    "tpu_dist: unknown transport '", requested,
                    "' (TPU_DIST_TRANSPORT takes auto, host or device)");
  runtime::Client& client = runtime::Client::get();
  int local = client.device_count(), global = client.global_device_count();
  bool spans_processes = global > local;
  if (requested == "device" || (requested != "host" && spans_processes)) {
    // A client spanning processes could run StableHLO collectives itself; that
    // transport is the second implementation of this interface, not written yet.
    TORCH_CHECK(requested != "device", "tpu_dist: the device-collective transport is not "
                "implemented; the ", client.platform(), " plugin's client sees ", global,
                " devices, ", local, " of them in this process");
    TORCH_WARN_ONCE("tpu_dist: the ", client.platform(), " plugin's client spans processes (",
                    global, " devices, ", local, " local); collectives still run host-staged");
  }
  *chosen = "host";
  return c10::make_intrusive<HostStagedTransport>(std::move(host));
}

}  // namespace tpu::distributed
