"""safetensors loads straight onto tpu, as onto CUDA: `load_file(path, device="tpu")`.

safetensors parses device strings in Rust against a fixed list of device types and refuses
"tpu"; a device index is accepted and placed by torch on the current accelerator, which is
tpu. So `safe_open` (and `load_file` through it) takes a tpu device as its index.
"""
from . import _on_import


def _as_index(device):
    import torch
    if isinstance(device, (str, torch.device)) and torch.device(device).type == "tpu":
        index = torch.device(device).index
        return torch.tpu.current_device() if index is None else index
    return device


def _patch(module) -> None:
    safe_open = module.safe_open
    if getattr(safe_open, "_torch_tpu", False):
        return

    def tpu_safe_open(filename, framework, device="cpu", *args, **kwargs):
        return safe_open(filename, framework, _as_index(device), *args, **kwargs)

    tpu_safe_open._torch_tpu = True
    tpu_safe_open.__doc__ = safe_open.__doc__
    module.safe_open = tpu_safe_open


def install() -> None:
    _on_import.patch_when_imported("safetensors", "safe_open", _patch)
    _on_import.patch_when_imported("safetensors.torch", "load_file", _patch)
