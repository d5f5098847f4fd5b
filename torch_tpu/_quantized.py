"""Routes torch's `out_dtype` higher-order op to our native int8 matmul.

torchao's int8 dynamic-activation path multiplies int8 by int8 into int32 through
`out_dtype(aten.mm, torch.int32, a, b)`. Its dense kernel sends that to `aten::_int_mm`
only for CUDA/XPU tensors, and otherwise casts both operands to int32 first (an int32
matmul: four times the operand bytes, and no int8 matrix units). On tpu the call goes to
`_int_mm`, which the lowering contracts as int8 with int32 accumulation.
"""
import torch
from torch._C import DispatchKey


def _is_tpu_int8_mm(op, output_dtype, args):
    return (op is torch.ops.aten.mm.default and output_dtype == torch.int32 and len(args) == 2
            and all(isinstance(a, torch.Tensor) and a.device.type == "tpu" for a in args)
            and args[0].dtype in (torch.int8, torch.uint8) and args[1].dtype == torch.int8)


def register():
    from torch._higher_order_ops.out_dtype import out_dtype, out_dtype_fallback

    if DispatchKey.PrivateUse1 in out_dtype.py_kernels:
        return

    @out_dtype.py_impl(DispatchKey.PrivateUse1)
    def _out_dtype_tpu(op, output_dtype, *args):
        if _is_tpu_int8_mm(op, output_dtype, args):
            return torch._int_mm(*args)
        return out_dtype_fallback(op, output_dtype, *args)
