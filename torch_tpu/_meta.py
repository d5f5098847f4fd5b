"""Meta (shape-only) kernels for the few ATen ops PyTorch ships without one. The backend
plans every lowered op from its Meta outputs, so without these the ops would take the CPU
fallback although a native rule exists. Registered only where PyTorch has none."""
import warnings

import torch

_lib = torch.library.Library("aten", "IMPL")


def untraced(fn, calls: bool = True):
    """Marks a Python kernel, and every call it makes, as never traced by torch.compile.
    A kernel runs below the dispatcher; where Dynamo left a frame to eager (a graph break
    in a loop), it would otherwise capture the kernel as a graph of its own, whose
    autograd then saves the kernel's inputs at their version before the kernel writes
    them (OmDet-Turbo's batch norm: "modified by an inplace operation").
    `calls=False` marks the function's own frame only: what it calls is met as it would
    be without it. (Dynamo still inlines the function where it traces a call of it.)"""
    frames = torch._C._dynamo.eval_frame
    skip = frames._FrameAction.SKIP
    nested = skip if calls else frames._FrameAction.DEFAULT
    frames.set_code_exec_strategy(fn.__code__, frames._FrameExecStrategy(skip, nested))
    return fn


def _dtype_name(t):
    """A dtype as ATen's messages name it (torch.float32 -> Float)."""
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
            torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}.get(t, str(t))


def _grad_like_input(*args, **kwargs):
    return torch.empty_like(args[1])  # (grad_output, self / log_probs, ...)


def _geqrf(a):
    return a.new_empty(a.shape), a.new_empty(a.shape[:-2] + (min(a.shape[-2:]),))


def _geqrf_out(x, *, a, tau):
    for out in (a, tau):
        torch._check(out.dtype == x.dtype, lambda: f"Expected out tensor to have dtype {x.dtype}, but got "
                     f"{out.dtype} instead")
    ra, rt = _geqrf(x)
    return a.resize_(ra.shape), tau.resize_(rt.shape)


def _linalg_lstsq(a, b, rcond=None, *, driver=None):
    # CPU's checks (the shapes below would broadcast a B of one row silently).
    torch._check(a.dtype == b.dtype, lambda: "torch.linalg.lstsq: Expected input and other to have the same "
                 f"dtype, but got input's dtype {_dtype_name(a.dtype)} and other's dtype {_dtype_name(b.dtype)}")
    torch._check(driver in (None, "gels", "gelsy", "gelsd", "gelss"),
                 lambda: "torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
    driver = driver or "gelsy"
    m, n = a.shape[-2:]
    vec = b.dim() == a.dim() - 1
    torch._check(b.shape[-1 if vec else -2] == m, lambda: "torch.linalg.lstsq: input.size(-2) should match "
                 f"other.size({-1 if vec else -2})")
    bb = b.unsqueeze(-1) if vec else b
    batch = torch.broadcast_shapes(a.shape[:-2], bb.shape[:-2])
    if m > n and driver in ("gelss", "gelsd"):
        # CPU returns residuals only when every matrix has full rank: a shape that
        # depends on values, so this case stays on the CPU.
        raise NotImplementedError("linalg_lstsq: residual shape depends on the rank")
    residuals = (batch + (() if vec else (bb.shape[-1],))) if m > n and driver == "gels" else (0,)
    return (a.new_empty(batch + ((n,) if vec else (n, bb.shape[-1]))),
            a.new_empty(residuals),
            a.new_empty((0,) if driver == "gels" else batch, dtype=torch.int64),
            a.new_empty(batch + (min(m, n),) if driver in ("gelss", "gelsd") else (0,)))


def _in_place_step(*args, **kwargs):
    """An optimizer step that only rewrites its list arguments: no new shapes."""
    return None


def _fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    # workspace: the gates r, z, n, the previous hidden state and hn (lowering/rnn.cpp)
    return torch.empty_like(hx), hx.new_empty((hx.shape[0], 5 * hx.shape[1]))


def _fused_gru_cell_backward(grad_hy, workspace, has_bias):
    b, h = grad_hy.shape
    gates = (grad_hy.new_empty((b, 3 * h)), grad_hy.new_empty((b, 3 * h)))
    bias = (grad_hy.new_empty((3 * h,)), grad_hy.new_empty((3 * h,))) if has_bias else (None, None)
    return gates + (torch.empty_like(grad_hy),) + bias


def _fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    # workspace: the activated gates i, f, g, o (lowering/rnn.cpp)
    return torch.empty_like(cx), torch.empty_like(cx), torch.empty_like(input_gates)


def _fq_refuse(ok, what):
    """A Meta kernel's refusal: the backend then raises CPU's own error for the call."""
    if not ok:
        raise RuntimeError(what)


_FQ_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _fq_outputs(self):
    return torch.empty_like(self), torch.empty_like(self, dtype=torch.bool)


def _fq_per_tensor_cachemask(self, scale, zero_point, quant_min, quant_max):
    _fq_refuse(quant_min <= quant_max and quant_min <= zero_point <= quant_max, "fake_quantize: arguments")
    _fq_refuse(self.dtype in _FQ_FLOATS, "fake_quantize: dtype")
    return _fq_outputs(self)


def _fq_per_tensor_cachemask_tq(self, scale, zero_point, fake_quant_enabled, quant_min, quant_max):
    _fq_refuse(quant_min <= quant_max and self.dtype in _FQ_FLOATS, "fake_quantize: arguments")
    _fq_refuse(scale.numel() == 1 and zero_point.numel() == 1 and fake_quant_enabled.numel() == 1,
               "fake_quantize: item() of a tensor of other than one element")
    _fq_refuse(not zero_point.dtype.is_complex and not scale.dtype.is_complex, "fake_quantize: complex")
    return _fq_outputs(self)


def _fq_per_channel_ok(self, scale, zero_point, axis, quant_min, quant_max, zero_point_dtypes):
    _fq_refuse(self.dtype in _FQ_FLOATS and scale.dtype == torch.float32 and zero_point.dtype in zero_point_dtypes
               and scale.dim() == 1 and zero_point.dim() == 1 and scale.numel() == zero_point.numel()
               and 0 <= axis < self.dim() and scale.numel() == self.shape[axis] and quant_min <= quant_max
               and scale.numel() > 0,  # CPU's range check of no zero points raises
               "fake_quantize_per_channel: arguments")


def _fq_per_channel_cachemask(self, scale, zero_point, axis, quant_min, quant_max):
    _fq_per_channel_ok(self, scale, zero_point, axis, quant_min, quant_max,
                       (torch.int32, torch.float32, torch.float16))
    return _fq_outputs(self)


def _fq_learnable_per_tensor(self, scale, zero_point, quant_min, quant_max, grad_factor=1.0):
    # (CPU reads scale[0]: a 0-d scale or zero point raises its IndexError.)
    _fq_refuse(scale.dim() >= 1 and zero_point.dim() >= 1
               and scale.numel() >= 1 and zero_point.numel() >= 1 and quant_min <= quant_max
               and self.dtype in _FQ_FLOATS and scale.dtype in _FQ_FLOATS and zero_point.dtype in _FQ_FLOATS,
               "fake_quantize_learnable: arguments")
    return torch.empty_like(self)


def _fq_learnable_per_tensor_backward(grad, self, scale, zero_point, quant_min, quant_max, grad_factor=1.0):
    f32 = torch.float32
    _fq_refuse(scale.dim() >= 1 and zero_point.dim() >= 1
               and scale.numel() >= 1 and zero_point.numel() >= 1 and grad.dtype == f32 and self.dtype == f32
               and scale.dtype == f32 and zero_point.dtype == f32 and self.numel() == grad.numel()
               and quant_min <= 0 <= quant_max, "fake_quantize_learnable_backward: arguments")
    if self.numel() == 0:
        return torch.empty_like(self), torch.empty_like(scale), torch.empty_like(zero_point)
    return torch.empty_like(self), self.new_empty((1,)), self.new_empty((1,))


def _fq_learnable_per_channel(self, scale, zero_point, axis, quant_min, quant_max, grad_factor=1.0):
    _fq_refuse(zero_point.dtype in _FQ_FLOATS, "fake_quantize_learnable: zero point dtype")
    _fq_per_channel_ok(self, scale, zero_point, axis, quant_min, quant_max, _FQ_FLOATS)
    return torch.empty_like(self)


def _fq_learnable_per_channel_backward(grad, self, scale, zero_point, axis, quant_min, quant_max, grad_factor=1.0):
    bf16, f32 = torch.bfloat16, torch.float32
    ok_dtype = (lambda t: t.dtype == f32) if self.dtype != bf16 else (lambda t: t.dtype in (f32, bf16))
    _fq_refuse(all(ok_dtype(t) for t in (grad, self, scale, zero_point)) and grad.shape == self.shape
               and quant_min <= 0 <= quant_max and scale.dim() == 1 and zero_point.dim() == 1
               and scale.numel() == zero_point.numel() and 0 <= axis < self.dim()
               and scale.numel() == self.shape[axis], "fake_quantize_learnable_backward: arguments")
    if self.numel() == 0:
        return torch.empty_like(self), torch.empty_like(scale), torch.empty_like(zero_point)
    return (torch.empty_like(self, dtype=f32), scale.new_empty(scale.shape, dtype=f32),
            scale.new_empty(scale.shape, dtype=f32))


def _fq_fused_moving_avg_obs(self, observer_on, fake_quant_on, running_min, running_max, scale, zero_point,
                             averaging_const, quant_min, quant_max, ch_axis, per_row_fake_quant=False,
                             symmetric_quant=False):
    """_fused_moving_avg_obs_fq_helper_functional: what the lowering handles (CPU's
    arithmetic needs f32 running stats and scale, int32 zero points, a quant range below
    2^24); anything else is refused, so CPU raises its error or computes it."""
    f32, flags = torch.float32, (observer_on, fake_quant_on)
    _fq_refuse(all(t.numel() == 1 and not t.dtype.is_floating_point and not t.dtype.is_complex for t in flags),
               "fused_moving_avg_obs_fq: flags")
    _fq_refuse(self.dtype in _FQ_FLOATS and self.numel() > 0 and running_min.dtype == f32
               and running_max.dtype == f32 and scale.dtype == f32, "fused_moving_avg_obs_fq: dtypes")
    _fq_refuse(-2 ** 31 <= quant_min < quant_max < 2 ** 31 and quant_max - quant_min < 2 ** 24,
               "fused_moving_avg_obs_fq: quant range")
    if per_row_fake_quant:
        _fq_refuse(self.dim() >= 2 and 0 <= ch_axis < self.dim(), "fused_moving_avg_obs_fq: axis")
        c = self.shape[ch_axis]
        _fq_refuse(running_min.numel() == c and running_max.numel() == c and scale.dim() == 1
                   and scale.numel() == c and zero_point.dim() == 1 and zero_point.numel() == c
                   and zero_point.dtype == torch.int32, "fused_moving_avg_obs_fq: per-channel qparams")
    else:
        _fq_refuse(all(t.numel() == 1 for t in (running_min, running_max, scale, zero_point))
                   and zero_point.dtype in (torch.int32, torch.int64), "fused_moving_avg_obs_fq: qparams")
    return _fq_outputs(self) + tuple(torch.empty_like(t) for t in (running_min, running_max, scale, zero_point))


def _padded_dense_to_jagged(dense, offsets, total_L=None):
    # The total is the values' length (a backward passes it); without it the shape
    # depends on the offsets' values, which the counted fallback reads.
    if total_L is None:
        raise NotImplementedError("_padded_dense_to_jagged_forward: the total length depends on the offsets")
    return dense.new_empty((total_L,) + tuple(dense.shape[len(offsets) + 1:]))


def _broadcast_like_first(*args):
    # binomial(count, prob, generator), _standard_gamma_grad(self, output),
    # _dirichlet_grad(x, alpha, total): CPU's TensorIterator broadcasts the tensors and
    # keeps the first's dtype (another dtype is refused before).
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return tensors[0].new_empty(torch.broadcast_shapes(*(t.shape for t in tensors)))


def _new_contiguous(self, generator=None):
    # _sample_dirichlet has no Meta kernel; _standard_gamma's and poisson's keep the
    # input's strides, where CPU's (and CUDA's) kernels return a contiguous tensor.
    return self.new_empty(self.shape)


def _convolution_overrideable(*args):
    # The hook _convolution calls for out-of-tree backends (the JIT tracer's route): the
    # shapes are convolution's.
    return torch.ops.aten.convolution(*args)


def _fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    """grad_input, shaped (and laid out, contiguous) as CPU's. What CPU would refuse, or read
    out of bounds for (indices of another shape), is refused here, so CPU gives its answer."""
    ok = (self.dim() in (4, 5) and grad_output.dim() == self.dim() and len(output_size) == 3
          and list(grad_output.shape[-3:]) == list(output_size) and grad_output.shape[:-3] == self.shape[:-3]
          and indices.shape == grad_output.shape and indices.dtype == torch.int64
          and grad_output.dtype == self.dtype)
    _fq_refuse(ok, "fractional_max_pool3d_backward: arguments")
    return self.new_empty(self.shape)


_KERNELS = {
    "convolution_overrideable": _convolution_overrideable,
    "_padded_dense_to_jagged_forward": _padded_dense_to_jagged,
    "_fused_adam_.tensor_lr": _in_place_step,
    "_fused_adamw_.tensor_lr": _in_place_step,
    "_fused_sgd_.tensor_lr": _in_place_step,
    "_fused_adagrad_.tensor_lr": _in_place_step,
    "_thnn_fused_gru_cell": _fused_gru_cell,
    "_thnn_fused_gru_cell_backward": _fused_gru_cell_backward,
    "geqrf": _geqrf,
    "geqrf.a": _geqrf_out,
    "linalg_lstsq": _linalg_lstsq,
    "multi_margin_loss_backward": _grad_like_input,
    "fractional_max_pool3d_backward": _fractional_max_pool3d_backward,
    "multilabel_margin_loss_backward": _grad_like_input,
    "_ctc_loss_backward": _grad_like_input,
    # random samplers (lowering/random_samplers.cpp)
    "binomial": _broadcast_like_first,
    "_standard_gamma_grad": _broadcast_like_first,
    "_dirichlet_grad": _broadcast_like_first,
    "_sample_dirichlet": _new_contiguous,
    # fake quantization (lowering/fake_quantize.cpp)
    "fake_quantize_per_tensor_affine_cachemask": _fq_per_tensor_cachemask,
    "_fake_quantize_per_tensor_affine_cachemask_tensor_qparams": _fq_per_tensor_cachemask_tq,
    "fake_quantize_per_channel_affine_cachemask": _fq_per_channel_cachemask,
    "_fake_quantize_learnable_per_tensor_affine": _fq_learnable_per_tensor,
    "_fake_quantize_learnable_per_tensor_affine_backward": _fq_learnable_per_tensor_backward,
    "_fake_quantize_learnable_per_channel_affine": _fq_learnable_per_channel,
    "_fake_quantize_learnable_per_channel_affine_backward": _fq_learnable_per_channel_backward,
    "_fused_moving_avg_obs_fq_helper_functional": _fq_fused_moving_avg_obs,
}


def _multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=1):
    from torch._decomp.decompositions import multi_margin_loss as ref
    out = ref(self, target, p, margin, weight, reduction)  # PyTorch's checks and shape
    # CPU's loss for a 0-d target is 0-d, also with reduction="none" (PyTorch's: [1]).
    return out.reshape(()) if reduction == 0 and target.dim() == 0 else out


def _multilabel_margin_loss_forward(self, target, reduction):
    from torch._decomp.decompositions import multilabel_margin_loss_forward as ref
    out, is_target = ref(self, target, reduction)
    # CPU's loss for one sample (target of at most 1 dim) is 0-d with reduction="none".
    return (out.reshape(()) if reduction == 0 and target.dim() <= 1 else out), is_target


# PyTorch's own Meta kernels are wrong here: the LSTM cell's reads `.device` of absent
# biases (nn.LSTM(bias=False)); the margin losses' shapes for one sample differ from
# what CPU (and our lowering, planned from the Meta shape) return; the samplers' layouts.
_REPLACED = {
    "_standard_gamma": _new_contiguous,
    "poisson": _new_contiguous,
    "_thnn_fused_lstm_cell": _fused_lstm_cell,
    "multi_margin_loss": _multi_margin_loss,
    "multilabel_margin_loss_forward": _multilabel_margin_loss_forward,
}


def register():
    for name, fn in _KERNELS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "Meta"):
            _lib.impl(name, untraced(fn), "Meta")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": meant
        warnings.simplefilter("ignore")
        for name, fn in _REPLACED.items():
            _lib.impl(name, untraced(fn), "Meta")
