"""`torch.nn.attention.flex_attention` runs on tpu, eager and under torch.compile.

PyTorch checks the query's device against a fixed list (cuda, cpu, xpu, hpu, mps) before
anything runs. What runs after it is device-neutral: eager calls compile the attention
higher-order op with an eager backend, whose dense implementation (scores, score_mod and
mask_mod applied elementwise, softmax, matmul) is ordinary ATen ops, lowered here like any
others; torch.compile(backend="tpu") records the same ops into its program. So the check
lets tpu through, and everything else it refuses stays refused.
"""
from . import _on_import


def _patch(module) -> None:
    validate = module._validate_device
    if getattr(validate, "_torch_tpu", False):
        return

    def tpu_validate_device(query, key, value):
        if query.device.type != "tpu":
            validate(query, key, value)

    tpu_validate_device._torch_tpu = True
    module._validate_device = tpu_validate_device


def install() -> None:
    _on_import.patch_when_imported("torch.nn.attention.flex_attention", "_validate_device", _patch)
