"""Hugging Face accelerate (and so `transformers.Trainer`) picks `tpu` as CUDA would be picked.

accelerate chooses its device from a fixed list (cuda, mps, xpu, npu, hpu, ...) and has no
hook for an out-of-tree PyTorch device; its "TPU" means PyTorch/XLA. transformers already
asks `torch.tpu` for the device and for bf16 support, but the model is placed by accelerate,
which would keep it on the CPU. So when `accelerate.state` is imported, its
`PartialState.default_device` (what accelerate falls back to when nothing else is set)
answers `tpu` where it would answer `cpu`. Nothing explicit is overridden: the
`ACCELERATE_TORCH_DEVICE` variable, `cpu=True` (`TrainingArguments(use_cpu=True)`), and
every real accelerator accelerate finds first keep their meaning.

The patch is applied when accelerate is imported, never by importing it here: `import torch`
must stay fast. `TPU_ACCELERATE=0` leaves accelerate alone.
"""
import importlib.abc
import importlib.util
import os
import sys

_TARGET = "accelerate.state"


def _patch(state_module) -> None:
    cls = state_module.PartialState
    original = cls.default_device
    if getattr(original.fget, "_torch_tpu", False):
        return

    def default_device(self):
        import torch
        device = original.fget(self)
        if device.type == "cpu" and torch.tpu.is_available():
            return torch.device("tpu", torch.tpu.current_device())
        return device

    default_device._torch_tpu = True
    cls.default_device = property(default_device, doc=original.__doc__)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of accelerate.state so the patch runs right after it executes."""

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)  # find the real spec below us, once
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def install() -> None:
    if os.environ.get("TPU_ACCELERATE", "1") == "0":
        return
    if _TARGET in sys.modules:
        _patch(sys.modules[_TARGET])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
