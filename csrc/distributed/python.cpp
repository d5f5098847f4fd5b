// torch_tpu._C's distributed entry points; torch_tpu/_internal/distributed registers
// the backend with torch.distributed.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "distributed/device_collectives.h"
#include "distributed/host_staged.h"
#include "distributed/staged_work.h"
#include "distributed/tpu_backend.h"
#include "runtime/host_address.h"

namespace tpu::distributed {

void bind(pybind11::module_& m) {
  namespace py = pybind11;
  Sequencer::set_wait_scope([](const std::function<void()>& wait) {
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      wait();
    } else {
      wait();
    }
  });
  // `host`: the CPU backend (a ProcessGroupGloo over a prefixed store) the host-staged
  // transport runs on; `store`: the one the group's processes meet on (where its splits
  // meet). Returned as _TpuDistBackend, a c10d Backend.
  m.def("_dist_create_backend",
        [](c10::intrusive_ptr<c10d::Backend> host, const std::string& transport,
           std::chrono::milliseconds timeout,
           std::optional<c10::intrusive_ptr<c10d::Store>> store) -> c10::intrusive_ptr<c10d::Backend> {
          // The device transport's choice exchanges device ids over `host`: other ranks
          // of this process (threads) must be able to run meanwhile.
          py::gil_scoped_release no_gil;
          return c10::make_intrusive<TpuBackend>(std::move(host), transport, timeout,
                                                 store.value_or(nullptr));
        },
        py::arg("host"), py::arg("transport") = "",
        py::arg("timeout") = ::kBackendDefaultTimeout, py::arg("store") = py::none());
  // The Python types c10d hands out for a tpu_dist backend and its options (they derive
  // from c10d's Backend and Backend.Options), with what c10d asks of a backend that
  // splits: split_group deep-copies its `options`; when the default group has a device_id,
  // new_group asks each rank outside the new group to perform_nocolor_split (NCCL's
  // non-members join ncclCommSplit). tpu_dist's new groups are made by their members
  // alone, so that is a no-op.
  py::class_<TpuBackendOptions, c10d::Backend::Options, c10::intrusive_ptr<TpuBackendOptions>>(
      m, "_TpuDistOptions")
      .def("__copy__", [](const TpuBackendOptions& o) { return c10::make_intrusive<TpuBackendOptions>(o); })
      .def("__deepcopy__", [](const TpuBackendOptions& o, const py::dict&) {
        return c10::make_intrusive<TpuBackendOptions>(o);
      });
  py::class_<TpuBackend, c10d::Backend, c10::intrusive_ptr<TpuBackend>>(m, "_TpuDistBackend")
      .def_property_readonly("options", &TpuBackend::getBackendOptions)
      .def("perform_nocolor_split", [](TpuBackend&, const std::optional<c10::Device>&) {},
           py::arg("device"));
  // The factory split() makes its groups with (torch_tpu's c10d factory, see set_group_factory).
  m.def("_dist_set_group_factory", [](py::object factory) {
    // Never freed: the last reference would otherwise drop at exit, without the GIL.
    auto* fn = new py::object(std::move(factory));
    set_group_factory([fn](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                           std::chrono::milliseconds timeout) {
      py::gil_scoped_acquire gil;
      return (*fn)(store, rank, size, timeout).cast<c10::intrusive_ptr<c10d::Backend>>();
    });
  });
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
