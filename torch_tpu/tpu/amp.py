"""`torch.tpu.amp`, as `torch.cuda.amp`: the device-typed spellings of torch.amp that CUDA
scripts use (`torch.cuda.amp.autocast()`, `torch.cuda.amp.GradScaler()`)."""
import functools

import torch


class autocast(torch.amp.autocast):
    """torch.autocast("tpu", ...); float16 by default, as torch.cuda.amp.autocast."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("tpu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """torch.amp.GradScaler("tpu", ...)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True):
        super().__init__("tpu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)


custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="tpu")
custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="tpu")
