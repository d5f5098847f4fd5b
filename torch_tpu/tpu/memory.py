"""`torch.tpu.memory`, as `torch.cuda.memory`: the memory functions under their module path."""
from . import (empty_cache, get_per_process_memory_fraction, max_memory_allocated, max_memory_reserved,  # noqa: F401
               mem_get_info, memory_allocated, memory_reserved, memory_stats, memory_summary,
               reset_accumulated_memory_stats, reset_max_memory_allocated, reset_peak_memory_stats,
               set_per_process_memory_fraction)
