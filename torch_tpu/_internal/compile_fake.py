"""Fake-tensor rules compiled mode needs where PyTorch's meta kernel states CUDA's rules.

Dynamo and AOTAutograd trace with fake tensors, whose shapes come from PyTorch's Python
meta kernels. `_grouped_mm`'s is CUDA's (bfloat16 only, 16-byte aligned strides), so a
float32 mixture of experts (transformers' grouped_mm experts) could not even be traced for
tpu, although the eager kernel and its lowering take float32, bfloat16 and float16
(csrc/backend/lowered_kernel.cpp's grouped_mm_meta states the same rules in C++). A rule
here answers only for fake tensors on tpu; every other device keeps PyTorch's.

Also where the fake kernel raises a different error than CPU's kernel for a call CPU
refuses: masked_fill with a non-bool mask fails in PyTorch's reference (a `where` whose
predicate is not bool); the eager kernel check (csrc/backend/kernel_checks.cpp) raises
CPU's message, and so does the fake rule.
"""
import torch

_installed = False


def _grouped_mm_size(a, b, offs=None, bias=None, out_dtype=None):
    for t, name in ((a, "mat_a"), (b, "mat_b")):
        torch._check(t.dtype in (torch.float32, torch.bfloat16, torch.float16),
                     lambda: f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got {t.dtype}")
    torch._check(a.dtype == b.dtype,
                 lambda: f"expected m1 and m2 to have the same dtype, but got: {a.dtype} != {b.dtype}")
    torch._check(a.dim() in (2, 3) and b.dim() in (2, 3),
                 lambda: f"Multiplicands must be 2D or 3D but got mat_a.dim()={a.dim()} and mat_b.dim()={b.dim()}")
    grouped = a.dim() == 2 or b.dim() == 2
    torch._check(grouped == (offs is not None),
                 lambda: "Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d")
    if a.dim() == 3 or b.dim() == 3:
        torch._check(a.size(-1) == b.size(-2), lambda: "contraction dimension of mat_a and mat_b must match")
    g = 0
    if grouped:
        torch._check(offs.dim() == 1, lambda: "offs has to be 1D")
        torch._check(offs.dtype == torch.int32, lambda: "Offsets have to be int32")
        g = offs.size(0)
    torch._check(bias is None, lambda: "Bias not supported yet")
    torch._check(out_dtype is None or out_dtype == a.dtype,
                 lambda: "Grouped gemm output dtype must match `mat_a` dtype")
    if a.dim() == 2 and b.dim() == 2:
        return (g, a.size(0), b.size(1))
    if a.dim() == 2:
        torch._check(g == b.size(0), lambda: "matrix batch sizes have to match")
        return (a.size(0), b.size(2))
    if b.dim() == 2:
        torch._check(g == a.size(0), lambda: "matrix batch sizes have to match")
        return (a.size(1), b.size(1))
    torch._check(a.size(0) == b.size(0), lambda: "batched dimension has to match")
    return (a.size(0), a.size(1), b.size(2))


def _grouped_mm_on_tpu(fake_mode, func, *args, **kwargs):
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager
    a = args[0] if args else kwargs["self"]
    if a.device.type != "tpu":
        return NotImplemented  # PyTorch's meta kernel decides
    size = _grouped_mm_size(*args, **{("a" if k == "self" else "b" if k == "mat2" else k): v
                                      for k, v in kwargs.items()})
    with in_kernel_invocation_manager(fake_mode):
        out = torch.empty(size, dtype=a.dtype, device="meta")
    return FakeTensor(fake_mode, out, a.device)


# ATen's names of dtypes in messages (c10's type names).
_ATEN_TYPE_NAMES = {torch.int64: "long int", torch.int32: "int", torch.int16: "short int", torch.int8: "signed char",
                    torch.uint8: "unsigned char", torch.float32: "float", torch.float64: "double",
                    torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16"}


def _masked_fill_on_tpu(fake_mode, func, *args, **kwargs):
    self = args[0] if args else kwargs["self"]
    mask = args[1] if len(args) > 1 else kwargs["mask"]
    if self.device.type == "tpu":
        torch._check(mask.dtype == torch.bool, lambda: "masked_fill_ only supports boolean masks, but got mask with "
                     f"dtype {_ATEN_TYPE_NAMES.get(mask.dtype, str(mask.dtype))}")
    return NotImplemented  # PyTorch's fake kernel computes the result


def install() -> None:
    """Adds the rules to FakeTensorMode's per-op implementations (once)."""
    global _installed
    if _installed:
        return
    from torch._subclasses.fake_impls import register_op_impl
    register_op_impl(lambda func: func is torch.ops.aten._grouped_mm.default)(_grouped_mm_on_tpu)
    masked_fills = (torch.ops.aten.masked_fill.Scalar, torch.ops.aten.masked_fill.Tensor,
                    torch.ops.aten.masked_fill_.Scalar, torch.ops.aten.masked_fill_.Tensor)
    register_op_impl(lambda func: func in masked_fills)(_masked_fill_on_tpu)
    _installed = True
