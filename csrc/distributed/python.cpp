// torch_tpu._C's distributed entry points; torch_tpu/_internal/distributed registers
// the backend with torch.distributed.
#include <torch/csrc/utils/pybind.h>

#include "distributed/device_collectives.h"
#include "distributed/host_staged.h"
#include "distributed/staged_work.h"
#include "distributed/tpu_backend.h"
#include "runtime/host_address.h"

namespace tpu::distributed {

void bind(pybind11::module_& m) {
  namespace py = pybind11;
  // `host`: the CPU backend (a ProcessGroupGloo over a prefixed store) the host-staged
  // transport runs on. Returned as c10d's Python Backend type.
  m.def("_dist_create_backend",
        [](c10::intrusive_ptr<c10d::Backend> host, const std::string& transport)
            -> c10::intrusive_ptr<c10d::Backend> {
          // The device transport's choice exchanges device ids over `host`: other ranks
          // of this process (threads) must be able to run meanwhile.
          py::gil_scoped_release no_gil;
          return c10::make_intrusive<TpuBackend>(std::move(host), transport);
        },
        py::arg("host"), py::arg("transport") = "");
  // At exit, before the interpreter finalizes (see Sequencer::drain_every).
  m.def("_dist_drain", [] {
    py::gil_scoped_release no_gil;  // the transport threads may need the GIL to finish
    Sequencer::drain_every();
  });
  // Whether the plugin reports that `device`'s buffers live in host memory (the
  // host-staged transport then reads them in place; TPU_DIST_HOST_ADDRESSES=0 turns that off).
  m.def("_dist_host_addresses", [](int device) {
    return runtime::buffers_in_host_memory(runtime::Client::get(), device);
  });
  m.def("_dist_writes_in_place", [] { return collective_writes_in_place(); });
  m.def("_dist_transport", [](const c10::intrusive_ptr<c10d::Backend>& b) {
    auto* tpu = dynamic_cast<TpuBackend*>(b.get());
    TORCH_CHECK_VALUE(tpu, "not a tpu_dist backend: ", b->getBackendName());
    return tpu->transport_name();
  });
  // Programs the device transport compiled (one per collective, shape, dtype, group).
  m.def("_dist_device_programs", [](const c10::intrusive_ptr<c10d::Backend>& b) {
    auto* tpu = dynamic_cast<TpuBackend*>(b.get());
    TORCH_CHECK_VALUE(tpu, "not a tpu_dist backend: ", b->getBackendName());
    auto* device = dynamic_cast<DeviceTransport*>(tpu->transport().get());
    TORCH_CHECK_VALUE(device, "this tpu_dist backend runs the ", tpu->transport_name(),
                      " transport, not the device one");
    return device->num_programs();
  });
}

}  // namespace tpu::distributed
