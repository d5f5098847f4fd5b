"""The same random draws on every device a model is compared on.

A model that samples while it trains (GroupViT's Gumbel assignments, ViT-MAE's patch
shuffle, CvT's drop path, VITS's prior noise) draws other numbers on tpu than on the CPU:
tpu's generator, like CUDA's, is not CPU's Mersenne Twister. Comparing such a step would
compare two generators, not two executions. So the CPU step records what each random op
drew, and the device step (and the float64 reference) is handed the same values, in
order: the op still runs on its own device, its result is then overwritten. The device's
generators are tested on their own (tests/test_rng.py)."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Random ops whose result is not a pure sample (it also carries the input's values):
# replaying the CPU's result would replace the device's arithmetic, not only its draw.
# Dropout rates are zeroed by the config shrink anyway; bernoulli masks replay.
NOT_SAMPLES = ("dropout", "rrelu")


def is_sample(func) -> bool:
    name = func.name()
    return (torch.Tag.nondeterministic_seeded in func.tags
            and not any(w in name for w in NOT_SAMPLES))


def _draw(name: str) -> str:
    """An op's name as a draw: aten::bernoulli_.float and aten::bernoulli.p are one."""
    return name.split(".")[0].rstrip("_")


class RandomDraws(TorchDispatchMode):
    """`RandomDraws()` records; `RandomDraws(recorded.values)` replays them."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Active around a compiled forward: Dynamo then still compiles (the mode is off
        # while it traces), the eager code between graph breaks draws through the mode,
        # and the graphs' own ops do too (compile.graph_calls_under runs them as ops).
        return True

    def __init__(self, values=None):
        super().__init__()
        self.recording = values is None
        self.values = [] if values is None else values
        self.used = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not is_sample(func) or not isinstance(out, torch.Tensor):
            return out
        if self.recording:
            self.values.append((func.name(), out.detach().to("cpu", copy=True)))
            return out
        if self.used >= len(self.values):
            raise RuntimeError(f"compat: {func.name()} is random draw {self.used + 1}, but the "
                               f"CPU step drew only {len(self.values)} times")
        name, value = self.values[self.used]
        # A compiled graph has the functional op where eager code ran the in-place one
        # (exponential for exponential_, bernoulli.p for bernoulli_.float): the same draw.
        if _draw(name) != _draw(func.name()) or value.shape != out.shape:
            raise RuntimeError(f"compat: random draw {self.used + 1} is {func.name()} "
                               f"{tuple(out.shape)} here, {name} {tuple(value.shape)} on CPU")
        self.used += 1
        with torch.no_grad():
            out.copy_(value)  # copies across devices and casts (the float64 reference)
        return out
