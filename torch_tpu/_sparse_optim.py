"""SparseAdam and Adagrad with sparse gradients on tpu: one set of programs, not one per row count.

PyTorch's steps coalesce a sparse gradient (`nn.Embedding(sparse=True)`'s) first; how many
distinct rows it has is data, so on tpu every op after the coalesce was built again for
each new count (~15 programs and ~0.5-1 s per step). A tpu parameter with a sparse
gradient takes `_C._sparse_adam_step` / `_C._sparse_adagrad_step` instead
(csrc/backend/sparse_optim.cpp): the same update, with the same values, sized by the
gradient's entry count. Other parameters go to PyTorch's functions unchanged.
"""
import math

import torch
from torch.optim import _functional as F, adagrad as _adagrad
from torch.optim.optimizer import _get_value, _to_scalar

from . import _C

_stock_sparse_adam = F.sparse_adam
_stock_single_tensor_adagrad = _adagrad._single_tensor_adagrad


def _ours(param, grad):
    return (param.device.type == "tpu" and grad.is_sparse and grad.sparse_dim() >= 1
            and grad.dtype == param.dtype and grad.shape == param.shape and not param.is_complex())


def sparse_adam(params, grads, exp_avgs, exp_avg_sqs, state_steps, *, eps, beta1, beta2, lr, maximize):
    rest = []
    for i, (param, grad) in enumerate(zip(params, grads)):
        if not _ours(param, grad):
            rest.append(i)
            continue
        step = state_steps[i]
        step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step)
        _C._sparse_adam_step(param, grad, exp_avgs[i], exp_avg_sqs[i], beta1, beta2, eps, step_size, maximize)
    if rest:
        pick = lambda xs: [xs[i] for i in rest]  # noqa: E731
        _stock_sparse_adam(pick(params), pick(grads), pick(exp_avgs), pick(exp_avg_sqs), pick(state_steps),
                           eps=eps, beta1=beta1, beta2=beta2, lr=lr, maximize=maximize)


def _single_tensor_adagrad(params, grads, state_sums, state_steps, grad_scale, found_inf, *, lr, weight_decay,
                           lr_decay, eps, has_sparse_grad, maximize, differentiable, has_complex):
    # Weight decay with a sparse gradient, a grad scaler and differentiable steps stay
    # PyTorch's (its errors included).
    mine = ([] if grad_scale is not None or found_inf is not None or differentiable or weight_decay != 0
            else [i for i, (p, g) in enumerate(zip(params, grads)) if _ours(p, g)])
    if mine:
        lr = _to_scalar(lr)
        for i in mine:
            state_steps[i] += 1
            clr = lr / (1 + (_get_value(state_steps[i]) - 1) * lr_decay)
            _C._sparse_adagrad_step(params[i], grads[i], state_sums[i], clr, eps, maximize)
    rest = sorted(set(range(len(params))) - set(mine))
    if rest:
        pick = lambda xs: [xs[i] for i in rest]  # noqa: E731
        _stock_single_tensor_adagrad(pick(params), pick(grads), pick(state_sums), pick(state_steps), grad_scale,
                                     found_inf, lr=lr, weight_decay=weight_decay, lr_decay=lr_decay, eps=eps,
                                     has_sparse_grad=has_sparse_grad, maximize=maximize,
                                     differentiable=differentiable, has_complex=has_complex)


def install():
    F.sparse_adam = sparse_adam
    _adagrad._single_tensor_adagrad = _single_tensor_adagrad
