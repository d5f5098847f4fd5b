"""torch.cuda's graph calls on tpu. A captured CUDA graph replays a step's kernels with one
launch; on tpu a step is one program already when compiled (torch.compile(backend="tpu"))
or fused (TPU_DEFER_AND_FUSE=1). So make_graphed_callables compiles its callables, and
capture by hand (CUDAGraph, graph) is an explicit error that names those two."""
import torch

_NO_CAPTURE = ("{}: tpu has no stream capture and replay. A step already runs as one program "
               "when compiled (torch.compile(model, backend=\"tpu\"), which "
               "torch.tpu.make_graphed_callables uses) or fused (TPU_DEFER_AND_FUSE=1)")


class CUDAGraph:
    """torch.cuda.CUDAGraph's name, refused at construction (see the module's note)."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(_NO_CAPTURE.format("torch.tpu.CUDAGraph"))


TPUGraph = CUDAGraph


class graph:
    """torch.cuda.graph's name, refused at construction (see the module's note)."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(_NO_CAPTURE.format("torch.tpu.graph"))


def graph_pool_handle():
    raise RuntimeError(_NO_CAPTURE.format("torch.tpu.graph_pool_handle"))


def _compiled(fn):
    if isinstance(fn, torch.nn.Module):
        # As torch.cuda's: the module itself comes back, its forward replaced.
        fn.forward = torch.compile(fn.forward, backend="tpu")
        return fn
    return torch.compile(fn, backend="tpu")


def make_graphed_callables(callables, sample_args, num_warmup_iters=3, allow_unused_input=False, pool=None):
    """torch.cuda.make_graphed_callables' contract (drop-in replacements, forward and
    backward each one program) by compiling each callable; sample_args are checked as
    torch.cuda checks them, and the programs compile at the first call."""
    del num_warmup_iters, allow_unused_input, pool  # capture's knobs: nothing to tune here
    just_one = not isinstance(callables, tuple)
    if just_one:
        callables, sample_args = (callables,), (sample_args,)
    if len(callables) != len(sample_args):
        raise ValueError("make_graphed_callables: give one tuple of sample args per callable")
    for args in sample_args:
        if not all(isinstance(a, torch.Tensor) for a in args):
            raise TypeError("In the beta API, sample_args for each callable must contain only Tensors. "
                            "Other types are not allowed.")
    out = tuple(_compiled(fn) for fn in callables)
    return out[0] if just_one else out
