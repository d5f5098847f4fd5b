"""torch.cuda's legacy tensor types under torch.tpu (`torch.tpu.FloatTensor(2, 3)`,
`isinstance(t, torch.tpu.LongTensor)`, `t.type(torch.tpu.FloatTensor)`), which older
programs moved from a GPU still use (`Tensor = torch.cuda.FloatTensor`)."""
import torch

_DTYPES = {
    "FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "LongTensor": torch.int64, "IntTensor": torch.int32,
    "ShortTensor": torch.int16, "CharTensor": torch.int8, "ByteTensor": torch.uint8,
    "BoolTensor": torch.bool,
}


def _sizes_only(args):
    return len(args) == 1 and isinstance(args[0], torch.Size) or all(isinstance(a, int) for a in args)


class _LegacyTensorType(type):
    """A tpu tensor type: calling it makes a tensor, isinstance checks device and dtype."""

    def __call__(cls, *args, device=None):
        where = torch.device("tpu") if device is None else torch.device(device)
        if _sizes_only(args):  # uninitialized, as torch.cuda.FloatTensor(2, 3)
            size = args[0] if len(args) == 1 and isinstance(args[0], torch.Size) else args or (0,)
            return torch.empty(size, dtype=cls.dtype, device=where)
        # data (a sequence, a tensor): the CPU type's constructor's rules, then moved
        return getattr(torch, cls.__name__)(*args).to(where)

    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Tensor) and obj.device.type == "tpu" and obj.dtype == cls.dtype

    def __repr__(cls):
        return f"<class 'torch.tpu.{cls.__name__}'>"


def _make(name, dtype):
    return _LegacyTensorType(name, (), {"dtype": dtype, "is_cuda": False, "is_sparse": False,
                                        "__module__": "torch.tpu"})


TYPES = {name: _make(name, dtype) for name, dtype in _DTYPES.items()}


def install(module):
    for name, cls in TYPES.items():
        setattr(module, name, cls)
    original = torch.Tensor.type

    def type(self, dtype=None, non_blocking=False, **kwargs):  # noqa: A001  (Tensor.type's name)
        if isinstance(dtype, _LegacyTensorType):
            dtype = f"torch.tpu.{dtype.__name__}"
        return original(self, dtype, non_blocking, **kwargs)

    type.__doc__ = original.__doc__
    torch.Tensor.type = type
