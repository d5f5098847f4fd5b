"""The ops torch.nn.SyncBatchNorm calls on an accelerator (PyTorch gives them kernels for
CUDA only, and CPU has none to fall back to): each rank's batch statistics, their
combination over the ranks' counts, the normalization and its backward. Each is composed
of ops tpu lowers natively; under DeferAndFuse they join the step's fused graph.

As CUDA's kernels do: statistics of float16/bfloat16 inputs are float32, the biased
variance normalizes and the unbiased one updates running_var, and
batch_norm_gather_stats(_with_counts) updates the running statistics in place (its schema
does not say so)."""
import torch

_lib = None


def _acc(t):
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def _reduced_dims(x):
    return [d for d in range(x.dim()) if d != 1]


def _per_channel(v, x):
    """A (C,) vector shaped to broadcast along dim 1 of x."""
    return v.reshape([1, -1] + [1] * (x.dim() - 2))


def _check(op, x):
    if x.dim() < 2:
        raise ValueError(f"{op}: expected an input of at least 2 dims (N, C, ...), got shape {tuple(x.shape)}")


def batch_norm_stats(input, eps):
    _check("batch_norm_stats", input)
    x = input.to(_acc(input))
    var, mean = torch.var_mean(x, _reduced_dims(x), correction=0)
    return mean, 1 / torch.sqrt(var + eps)


def batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps,
                                        counts):
    counts = counts.to(mean.dtype).reshape(-1, 1)
    n = counts.sum()
    total = (counts * mean).sum(0) / n
    # Each rank's biased variance, from its invstd; then the pooled one: within-rank
    # spread plus the spread of the ranks' means about the total mean.
    var = 1 / (invstd * invstd) - eps
    pooled = (counts * (var + (mean - total) ** 2)).sum(0) / n
    if running_mean is not None:
        running_mean.mul_(1 - momentum).add_((total * momentum).to(running_mean.dtype))
    if running_var is not None:
        unbiased = pooled * (n / (n - 1))
        running_var.mul_(1 - momentum).add_((unbiased * momentum).to(running_var.dtype))
    return total, 1 / torch.sqrt(pooled + eps)


def batch_norm_gather_stats(input, mean, invstd, running_mean, running_var, momentum, eps, count):
    counts = torch.full((mean.shape[0],), count, dtype=mean.dtype, device=mean.device)
    return batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum,
                                               eps, counts)


def batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    _check("batch_norm_elemt", input)
    x = input.to(mean.dtype)
    y = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
    if weight is not None:
        y = y * _per_channel(weight.to(y.dtype), x)
    if bias is not None:
        y = y + _per_channel(bias.to(y.dtype), x)
    return y.to(input.dtype)


def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
    """(sum of dy, sum of dy * (x - mean), grad_weight, grad_bias) per channel; the ones
    not asked for are empty."""
    _check("batch_norm_backward_reduce", input)
    dims = _reduced_dims(input)
    g = grad_out.to(mean.dtype)
    sum_dy = g.sum(dims)
    sum_dy_xmu = (g * (input.to(mean.dtype) - _per_channel(mean, input))).sum(dims)
    param = weight.dtype if weight is not None else input.dtype
    none = mean.new_empty((0,))
    return (sum_dy if input_g else none, sum_dy_xmu if input_g else none,
            (sum_dy_xmu * invstd).to(param) if weight_g else none.to(param),
            sum_dy.to(param) if bias_g else none.to(param))


def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    _check("batch_norm_backward_elemt", input)
    n = count.sum().to(mean.dtype)
    x = input.to(mean.dtype)
    g = grad_out.to(mean.dtype)
    mean_dy, mean_dy_xmu = sum_dy / n, sum_dy_xmu / n
    scale = invstd if weight is None else invstd * weight.to(mean.dtype)
    dx = (g - _per_channel(mean_dy, x)
          - (x - _per_channel(mean, x)) * _per_channel(invstd * invstd * mean_dy_xmu, x))
    return (dx * _per_channel(scale, x)).to(input.dtype)


def register():
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    for fn in (batch_norm_stats, batch_norm_gather_stats_with_counts, batch_norm_gather_stats,
               batch_norm_elemt, batch_norm_backward_reduce, batch_norm_backward_elemt):
        _lib.impl(fn.__name__, fn, "PrivateUse1")
