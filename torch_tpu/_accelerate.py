"""Hugging Face accelerate (and so `transformers.Trainer`) picks `tpu` as CUDA would be picked.

accelerate chooses its device from a fixed list (cuda, mps, xpu, npu, hpu, ...) and has no
hook for an out-of-tree PyTorch device; its "TPU" means PyTorch/XLA. transformers already
asks `torch.tpu` for the device and for bf16 support, but the model is placed by accelerate,
which would keep it on the CPU. So when `accelerate.state` is imported, its
`PartialState.default_device` (what accelerate falls back to when nothing else is set)
answers `tpu` where it would answer `cpu`, and under torchrun the ranks form a process
group over Gloo and tpu_dist, each on its own tpu device, with DDP around the model. Nothing explicit is overridden: the
`ACCELERATE_TORCH_DEVICE` variable, `cpu=True` (`TrainingArguments(use_cpu=True)`), and
every real accelerator accelerate finds first keep their meaning.

fp16 mixed precision (`TrainingArguments(fp16=True)`) works as on CUDA: accelerate refuses
it on any device outside a fixed tuple in `Accelerator.__init__`, which gains "tpu", and
its gradient scaler is `torch.amp.GradScaler("tpu")` (accelerate's fallback is CUDA's,
which disables itself where CUDA is absent: fp16 gradients would underflow unscaled).

The patches are applied when accelerate is imported, never by importing it here: `import torch`
must stay fast. `TPU_ACCELERATE=0` leaves accelerate alone.
"""
import importlib.abc
import importlib.util
import os
import sys
import types



# The process-group backend a torchrun launch gets: Gloo for CPU tensors, tpu_dist for tpu.
_BACKEND = "cpu:gloo,tpu:tpu_dist"


def _patch_state(state_module) -> None:
    cls = state_module.PartialState
    if getattr(cls, "_torch_tpu", False):
        return
    cls._torch_tpu = True
    DistributedType = state_module.DistributedType
    default_device, prepare_backend, set_device = cls.default_device, cls._prepare_backend, cls.set_device

    def tpu_default_device(self):
        import torch
        device = default_device.fget(self)
        if device.type == "cpu" and torch.tpu.is_available():
            return torch.device("tpu", torch.tpu.current_device())
        return device

    # Under torchrun (LOCAL_RANK set) accelerate finds no accelerator of its list and would
    # run each rank alone. With tpu it runs as accelerate's CPU multi-process type, whose
    # models are wrapped in DDP without device_ids (as tpu_dist wants), over Gloo + tpu_dist,
    # each rank on its own tpu device.
    def tpu_prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        import torch
        got, kind = prepare_backend(self, cpu, sagemaker_dp, backend)
        if (kind == DistributedType.NO and not cpu and backend in (None, "tpu_dist", _BACKEND)
                and int(os.environ.get("LOCAL_RANK", -1)) != -1 and torch.tpu.is_available()):
            return _BACKEND, DistributedType.MULTI_CPU
        return got, kind

    def tpu_set_device(self):
        if self.device is None and self.backend == _BACKEND:
            import torch
            self.device = torch.device("tpu", self.local_process_index % torch.tpu.device_count())
            torch.tpu.set_device(self.device)
            return
        set_device(self)

    cls.default_device = property(tpu_default_device, doc=default_device.__doc__)
    cls._prepare_backend = tpu_prepare_backend
    cls.set_device = tpu_set_device


def _patch_accelerator(module) -> None:
    cls = module.Accelerator
    if getattr(cls, "_torch_tpu", False):
        return
    cls._torch_tpu = True
    # The devices fp16 is allowed on: a constant tuple of the constructor's code.
    init = cls.__init__
    code = init.__code__
    consts = tuple(c + ("tpu",) if isinstance(c, tuple) and "cuda" in c and "mps" in c and "tpu" not in c else c
                   for c in code.co_consts)
    init.__code__ = code.replace(co_consts=consts)
    get_grad_scaler = module.get_grad_scaler

    def tpu_grad_scaler(distributed_type=None, **kwargs):
        import torch
        if module.AcceleratorState().device.type == "tpu" and distributed_type != module.DistributedType.FSDP:
            return torch.amp.GradScaler("tpu", **kwargs)
        return get_grad_scaler(distributed_type, **kwargs)

    module.get_grad_scaler = tpu_grad_scaler


_PATCHES = {"accelerate.state": _patch_state, "accelerate.accelerator": _patch_accelerator}
_DEFINES = {"accelerate.state": "PartialState", "accelerate.accelerator": "Accelerator"}  # once executed


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self._loader = loader
        self._patch = patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loaders of the patched modules so each patch runs right after its module executes."""

    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        sys.meta_path.remove(self)  # find the real spec below us, once
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, _PATCHES[name])
        return spec


class _PatchOnceLoaded(types.ModuleType):
    """The `accelerate` package while one of its patched modules is still executing (it
    imported torch, whose start-up loaded torch_tpu): importlib sets each finished
    submodule as an attribute of its package, and that is when the patch applies."""

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        full = f"{self.__name__}.{name}"
        if full in _PATCHES and _loaded(full, value):
            _PATCHES[full](value)
        if all(_loaded(n, sys.modules.get(n)) for n in _PATCHES):
            object.__setattr__(self, "__class__", types.ModuleType)


def _loaded(name, module) -> bool:
    return module is not None and hasattr(module, _DEFINES[name])


def install() -> None:
    if os.environ.get("TPU_ACCELERATE", "1") == "0":
        return
    for name, patch in _PATCHES.items():
        module = sys.modules.get(name)
        if _loaded(name, module):
            patch(module)
        elif module is not None and type(sys.modules.get("accelerate")) is types.ModuleType:
            sys.modules["accelerate"].__class__ = _PatchOnceLoaded
    if not all(name in sys.modules for name in _PATCHES) and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
