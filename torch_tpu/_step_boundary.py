"""Training steps end at optimizer steps: there the deferred graph is cut and launched.

Cutting at the same place every step makes every step's graph the same program, so it
compiles once; launching without waiting lets Python record the next step meanwhile.
"""
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import _C


def _after_optimizer_step(optimizer, args, kwargs):
    if torch.compiler.is_compiling():
        return  # a compiled step is its own program: nothing to cut, no graph break
    if _C.get_eager_mode() == 2:  # EagerMode.DEFER_AND_FUSE
        _C.flush("optimizer step")


# Kept so a benchmark can time a step's recording apart from its launch.
handle = register_optimizer_step_post_hook(_after_optimizer_step)
