"""`torch_tpu.dynamism`: the public name of torch_tpu._internal.dynamism."""
from ._internal.dynamism import get_dynamism_info, mark_dynamic  # noqa: F401
