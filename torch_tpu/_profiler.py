"""A profiler asked for CUDA activity profiles the tpu device when CUDA is not available.

Code moved from a GPU names `ProfilerActivity.CUDA` (or the legacy profiler's
`use_cuda=True` / `use_device="cuda"`): PyTorch would warn that CUDA is not available and
record host events only. Here the request means "the accelerator", so it records tpu
device time and memory (PrivateUse1) instead, and says so in a warning.
"""
import functools
import warnings

import torch

from . import _on_import

_NOTE = ("torch_tpu: the profiler's CUDA activity records the tpu device (CUDA is not "
         "available); name ProfilerActivity.PrivateUse1 to silence this")


def _tpu_stands_in_for_cuda() -> bool:
    return not torch.cuda.is_available() and torch.tpu.is_available()


def _note(stacklevel):
    warnings.warn(_NOTE, stacklevel=stacklevel + 1)


def _patch_kineto(module):
    Activity = torch.profiler.ProfilerActivity
    original = module._KinetoProfile.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if Activity.CUDA not in self.activities or not _tpu_stands_in_for_cuda():
            return
        self.activities = (set(self.activities) - {Activity.CUDA}) | {Activity.PrivateUse1}
        if Activity.CUDA in self.activity_filters:
            self.activity_filters[Activity.PrivateUse1] = self.activity_filters.pop(Activity.CUDA)
        self.use_device = "tpu"
        _note(3)  # the user's profile(...), through torch.profiler.profile's __init__

    module._KinetoProfile.__init__ = __init__


def _patch_legacy(module):
    original = module.profile.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        asks_cuda = kwargs.get("use_cuda") or kwargs.get("use_device") == "cuda"
        if asks_cuda and _tpu_stands_in_for_cuda():
            kwargs["use_cuda"] = False
            kwargs["use_device"] = "tpu"
            _note(2)
        original(self, *args, **kwargs)

    module.profile.__init__ = __init__


def install():
    _on_import.patch_when_imported("torch.profiler.profiler", "_KinetoProfile", _patch_kineto)
    _on_import.patch_when_imported("torch.autograd.profiler", "profile", _patch_legacy)
