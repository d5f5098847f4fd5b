"""torch_tpu: a native PyTorch backend for TPUs (device "tpu") on the PJRT C API.

Importing it (or just `import torch`, through the `torch.backends` entry point)
registers the device. Move code from GPU by writing "tpu" where it said "cuda".
"""
import os
import sys


def _autoload():
    """Entry point for `torch.backends`: importing this module is all it takes.

    Defined before `import torch`: when `import torch_tpu` comes first, torch's
    autoload finds this name on the partly imported package.
    """


import torch  # noqa: E402

# The XLA plugins log INFO lines to stderr at start-up; keep warnings and errors.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
torch.utils.rename_privateuse1_backend("tpu")

from . import _C  # noqa: E402  (registers kernels, allocator, device guard)
from . import _plugins  # noqa: E402

_num_lowered = _C._init(_plugins.candidates())

import atexit  # noqa: E402

atexit.register(_C._drain)  # deferred graphs still launching finish before teardown

from . import _meta  # noqa: E402  (shapes of the few ops PyTorch has no Meta kernel for)

_meta.register()
from . import _decompositions  # noqa: E402  (after the rules: ops still without a kernel)

_decompositions.register()

from . import tpu as _tpu_module  # noqa: E402

torch._register_device_module("tpu", _tpu_module)
for _sub in ("amp", "graphs", "memory", "nvtx", "random", "streams"):  # import torch.tpu.<sub>
    sys.modules[f"torch.tpu.{_sub}"] = getattr(_tpu_module, _sub)
torch.utils.generate_methods_for_privateuse1_backend(
    for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
)

from ._internal.execution_mode import EagerMode, get_eager_mode, set_eager_mode  # noqa: E402
from ._internal.sync import synchronize  # noqa: E402
from ._metrics import metrics, metrics_report  # noqa: E402
from . import api  # noqa: E402
from . import _step_boundary  # noqa: E402,F401  (cuts deferred graphs at optimizer steps)
from . import _module_state  # noqa: E402,F401  (modules' parameters and buffers are state)
from . import _sparse_optim  # noqa: E402  (SparseAdam/Adagrad steps on sparse gradients)

_sparse_optim.install()
from . import _accelerate  # noqa: E402  (Hugging Face accelerate/Trainer default to tpu)
from . import _multiprocessing  # noqa: E402  (tpu tensors through torch.multiprocessing)

_multiprocessing.install()
from . import _dlpack  # noqa: E402  (DLPack export/import of tpu tensors)

_dlpack.install()
from . import _serialization  # noqa: E402  (torch.load gives tpu storages their tensor's shape)

_serialization.install()

_accelerate.install()
from . import _safetensors  # noqa: E402  (safetensors loads onto device="tpu")
_safetensors.install()
from . import _attention  # noqa: E402  (flex_attention's device check; jagged SDPA)
_attention.install()

if torch.distributed.is_available():
    from ._internal import distributed as _distributed  # noqa: E402,F401  (registers tpu_dist)
from . import _sync_batch_norm  # noqa: E402  (torch.nn.SyncBatchNorm's ops)

_sync_batch_norm.register()
from . import _transformer  # noqa: E402  (nn.TransformerEncoder's nested fast path on tpu)

_transformer.install()
from . import _data_parallel  # noqa: E402  (torch.nn.DataParallel's copies between tpu devices)

_data_parallel.install()
from . import _profiler  # noqa: E402  (the profiler's CUDA activity records tpu)

_profiler.install()
from . import _quantized  # noqa: E402  (torchao's int8 x int8 -> int32 mm on _int_mm)

_quantized.register()
from ._internal.compile import TpuBackend, _route_inductor_to_tpu  # noqa: E402
from . import dynamism  # noqa: E402  (mark_dynamic for compiled mode)
from . import pallas  # noqa: E402  (jax_op; imports JAX only when first used)

_route_inductor_to_tpu()  # torch.compile(model) on tpu tensors uses backend "tpu"

__all__ = [
    "EagerMode", "set_eager_mode", "get_eager_mode", "synchronize", "metrics",
    "metrics_report", "api", "TpuBackend", "dynamism", "pallas",
]

