"""Training steps end at optimizer steps: there the deferred graph is cut and launched.

Cutting at the same place every step makes every step's graph the same program, so it
compiles once; launching without waiting lets Python record the next step meanwhile.

With a GradScaler the step ends at `scaler.update()`, after the optimizer steps it ran:
cut at the optimizer step, the scale's update would join the next step's graph, which
the first step's graph lacks, so the second step compiled its graphs again.
"""
import threading

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from . import _C

_scaler = threading.local()  # depth: inside GradScaler.step on this thread


def _cut(reason, optimizers=()):
    if _C.get_eager_mode() != 2:  # EagerMode.DEFER_AND_FUSE
        return
    devices = _devices_of(optimizers)
    if devices:
        # This thread's graphs of its parameters' devices only (its backward joined them).
        # Cutting other threads' or devices' graphs too (a training thread per device, or
        # threads sharing one) would cut them wherever those had got to, different at
        # every step (new programs).
        _C.flush(reason, devices)
    else:
        _C.flush(reason)


def _devices_of(optimizers):
    return sorted({p.device.index for o in optimizers for g in o.param_groups for p in g["params"]
                   if p.device.type == "tpu"})


_cut_queued_for = threading.local()  # the backward whose end already cuts the graph


def _after_optimizer_step(optimizer, args, kwargs):
    if torch.compiler.is_compiling():
        return  # a compiled step is its own program: nothing to cut, no graph break
    _C._set_recording_state(False)
    if getattr(_scaler, "depth", 0):
        return  # a GradScaler's step: cut at its update
    task = torch._C._current_graph_task_id()
    if task != -1:
        # An optimizer step inside a backward (per-parameter steps from gradient hooks): the
        # training step ends with the backward, so cut once there, not at every parameter.
        if getattr(_cut_queued_for, "task", None) != task:
            _cut_queued_for.task = task
            torch.autograd.Variable._execution_engine.queue_callback(lambda: _cut("optimizer step", [optimizer]))
        return
    _cut("optimizer step", [optimizer])


def _cut_at_scaler_update(scaler_class):
    step, update = scaler_class.step, scaler_class.update

    def scaler_step(self, optimizer, *args, **kwargs):
        if torch.compiler.is_compiling():
            return step(self, optimizer, *args, **kwargs)
        _scaler.depth = getattr(_scaler, "depth", 0) + 1
        try:
            return step(self, optimizer, *args, **kwargs)
        finally:
            _scaler.depth -= 1
            _scaler.stepped = getattr(_scaler, "stepped", []) + [optimizer]  # cut at update

    def scaler_update(self, *args, **kwargs):
        out = update(self, *args, **kwargs)
        if not torch.compiler.is_compiling():
            stepped, _scaler.stepped = getattr(_scaler, "stepped", []), []
            _cut("optimizer step", stepped)
        return out

    for new, old in ((scaler_step, step), (scaler_update, update)):
        new.__doc__, new.__name__, new.__qualname__ = old.__doc__, old.__name__, old.__qualname__
    scaler_class.step, scaler_class.update = scaler_step, scaler_update


def _record_state(optimizer, args, kwargs):
    # Fills an optimizer's step records are its state (made at its first step): the graph
    # reads them as it reads them at later steps (deferred.cpp's hoist_fills).
    if not torch.compiler.is_compiling():
        _C._set_recording_state(True)


def _record_scaler_state(scaler_class):
    lazy_init = scaler_class._lazy_init_scale_growth_tracker

    def init_scale_as_state(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return lazy_init(self, *args, **kwargs)
        _C._set_recording_state(True)
        try:
            return lazy_init(self, *args, **kwargs)
        finally:
            _C._set_recording_state(False)

    scaler_class._lazy_init_scale_growth_tracker = init_scale_as_state


def _cut_at_optimizer_construction(optimizer_class):
    # A model made on the device records its initialization (random and zero fills of
    # its parameters) before its first step: cut there, or the first step's graph holds
    # the initialization and the second step's graph, without it, is another to compile.
    init = optimizer_class.__init__

    def optimizer_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if not torch.compiler.is_compiling():
            _cut("optimizer made", [self])

    optimizer_init.__doc__, optimizer_init.__name__ = init.__doc__, init.__name__
    optimizer_init.__qualname__ = init.__qualname__
    optimizer_class.__init__ = optimizer_init


# Kept so a benchmark can time a step's recording apart from its launch.
handle = register_optimizer_step_post_hook(_after_optimizer_step)
state_handle = register_optimizer_step_pre_hook(_record_state)
_cut_at_scaler_update(torch.amp.GradScaler)
_cut_at_optimizer_construction(torch.optim.Optimizer)
_record_scaler_state(torch.amp.GradScaler)
