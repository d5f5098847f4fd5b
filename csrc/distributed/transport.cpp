#include "distributed/transport.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "backend/device.h"
#include "distributed/device_collectives.h"
#include "distributed/host_staged.h"
#include "runtime/client.h"
#include "runtime/multi_device.h"

namespace tpu::distributed {
namespace {

// Every rank's global device id, by rank (one small all-gather on the host backend).
std::vector<int64_t> exchange_device_ids(const c10::intrusive_ptr<c10d::Backend>& host, int64_t mine) {
  std::vector<at::Tensor> in{at::full({1}, mine, at::kLong)};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < host->getSize(); ++r) out[0].push_back(at::empty({1}, at::kLong));
  host->allgather(out, in)->wait();
  std::vector<int64_t> ids;
  for (auto& t : out[0]) ids.push_back(t.item<int64_t>());
  return ids;
}

}  // namespace

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
    // Every rank takes this branch (same settings, same plugin): the exchange matches.
    int device = backend::current_device();
    std::vector<int64_t> ids = exchange_device_ids(host, runtime::global_device_id(client, device));
    std::string blocker = device_transport_blocker(ids);
    if (blocker.empty()) {
      *chosen = "device";
      return c10::make_intrusive<DeviceTransport>(std::move(host), std::move(ids), device);
    }
    TORCH_CHECK(requested != "device", "tpu_dist: the device-collective transport cannot run "
                "this group of ", ids.size(), " processes: ", blocker,
                ". TPU_DIST_TRANSPORT=host (or auto) runs its collectives host-staged over Gloo");
    TORCH_WARN_ONCE("tpu_dist: the ", client.platform(), " plugin's client spans processes (",
                    global, " devices, ", local, " local) but ", blocker,
                    "; collectives run host-staged");
  }
  *chosen = "host";
  return c10::make_intrusive<HostStagedTransport>(std::move(host));
}

}  // namespace tpu::distributed
