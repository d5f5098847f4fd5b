"""ATen ops without a native rule run PyTorch's own decompositions on tpu tensors.

PyTorch ships Python decompositions (`torch._decomp.decomposition_table`) that
express many ops through other ATen ops. For an op that has no tpu kernel of its own
(no lowering rule, no composite kernel), `register()` installs a PrivateUse1 kernel
that runs the decomposition on the tpu tensors themselves: the ops it calls are
lowered natively, so nothing crosses to the host.

Left alone: ops with a tpu kernel already (lowering rules are registered first), ops
with a CompositeImplicitAutograd kernel (a backend kernel would bypass their
autograd) or a CompositeExplicitAutograd one (they already run on tpu through other
ops), and view ops (a decomposition would copy instead of alias).

A decomposition that declines a call (returns NotImplemented), fails, or reaches its
own op again runs that call through a host round trip, counted in `fallbacks` and merged
into `torch_tpu.metrics()["fallbacks"]` like the C++ fallback, and forbidden by
TPU_FALLBACK=error in the same way. `TPU_DECOMPOSITIONS=0` disables all of this.
"""
import os
import threading
import warnings

import torch
from torch.utils import _pytree as pytree

from ._meta import untraced

registered: list = []          # op names ("aten::nansum") given a decomposition kernel
fallbacks: dict = {}           # op name -> host round trips taken by decomposition kernels
_lib = None
_state = threading.local()
_lock = threading.Lock()
# Decompositions that always reach their own op again (the reference calls a prim that
# runs the op itself): no use on tpu, so these ops keep the C++ fallback.
_EXCLUDED: set = {
    "aten::" + n + ".out" for n in (
        "digamma", "lgamma", "i0", "erfinv", "igamma", "igammac", "nextafter", "special_i1",
        "special_i1e", "special_i0e", "special_erfcx", "special_ndtri", "special_zeta",
        "special_bessel_j0", "special_bessel_j1", "special_spherical_bessel_j0")
} | {"aten::frexp.Tensor_out",
     # Their references assign through complex views (.real/.imag), which tpu cannot
     # alias: the writes would be lost.
     "aten::polar.out", "aten::complex.out"}


def _batch_norm(op, decomp):
    """Batch norm runs as the native rules (csrc/lowering/normalization.cpp), whose sums
    are compensated as CPU's are in double: inference is _native_batch_norm_legit_no_training,
    with empty saved statistics as on CPU (the decomposition and the meta kernel make full
    ones); training is one _native_batch_norm_legit_functional program whose new running
    statistics are then written in place, or .no_stats without running statistics."""
    def run(input, weight, bias, running_mean, running_var, training, momentum, eps):
        have_stats = running_mean is not None and running_var is not None
        if not training and have_stats:
            out = torch.ops.aten._native_batch_norm_legit_no_training(
                input, weight, bias, running_mean, running_var, momentum, eps)[0]
            return out, input.new_empty((0,)), input.new_empty((0,))
        if training and have_stats:
            out, mean, rstd, new_mean, new_var = torch.ops.aten._native_batch_norm_legit_functional(
                input, weight, bias, running_mean, running_var, True, momentum, eps)
            running_mean.copy_(new_mean)
            running_var.copy_(new_var)
            return out, mean, rstd
        if training and running_mean is None and running_var is None:
            return torch.ops.aten._native_batch_norm_legit.no_stats(
                input, weight, bias, True, momentum, eps)
        return decomp(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return run


def _aminmax_out_dtypes(args, kwargs):
    """CPU's aminmax writes only out tensors of the input's dtype (the decomposition casts)."""
    x = args[0] if args else kwargs.get("self")
    for name in ("min", "max"):
        o = kwargs.get(name)
        if isinstance(o, torch.Tensor) and isinstance(x, torch.Tensor) and o.dtype != x.dtype:
            raise RuntimeError(f"aminmax: out tensor {name} is {o.dtype}, expected {x.dtype} (the input's dtype)")


def _reflection_pad2d_sizes(args, kwargs):
    """CPU's check: each pad below its dimension's size (the decomposition would read out of
    range and return a tensor of meaningless values)."""
    x = args[0] if args else kwargs.get("self")
    pad = list(args[1] if len(args) > 1 else kwargs.get("padding"))
    if not isinstance(x, torch.Tensor) or len(pad) != 4 or x.dim() not in (3, 4):
        return
    for arg, (a, b), dim in ((4, pad[0:2], x.dim() - 1), (6, pad[2:4], x.dim() - 2)):
        if a >= x.shape[dim] or b >= x.shape[dim]:
            raise RuntimeError(f"Argument #{arg}: Padding size should be less than the corresponding input "
                               f"dimension, but got: padding ({a}, {b}) at dimension {dim} of input {list(x.shape)}")


# Argument checks CPU's kernel makes and the decomposition does not: op name -> check(args, kwargs),
# run before the decomposition (whose own failures take the host round trip).
_CHECKS = {"aten::aminmax.out": _aminmax_out_dtypes, "aten::reflection_pad2d": _reflection_pad2d_sizes}

# Ops whose decomposition is wrapped: op name -> (op, decomposition) -> function.
def _isin(op, decomp):
    """The decomposition searches sorted test elements, which a NaN among them (sorted
    last) sends astray: a present value was reported absent. A NaN is in no set, so each
    becomes the smallest test element, which changes no answer (CPU's kernel sorts and
    compares neighbours instead)."""
    def run(*args, **kwargs):
        args = list(args)
        at = 1 if len(args) > 1 else None
        test = args[at] if at is not None else kwargs.get("test_elements")
        if isinstance(test, torch.Tensor) and test.is_floating_point() and test.numel() > 1:
            flat = test.reshape(-1)
            test = torch.where(flat.isnan(), flat.sort().values[:1], flat).reshape(test.shape)
            if at is not None:
                args[at] = test
            else:
                kwargs["test_elements"] = test
        return decomp(*args, **kwargs)
    return run


def _huber_loss(op, decomp):
    """CPU's huber_loss computes in the promoted dtype and writes the input's dtype (the
    decomposition returns the promoted one); a promotion that cannot be cast back, or one
    with float8, raises CPU's error, found by CPU's kernel on empty tensors."""
    def run(input, target, *rest, **kwargs):
        if input.dtype != target.dtype:
            torch.ops.aten.huber_loss(torch.empty(0, dtype=input.dtype), torch.empty(0, dtype=target.dtype))
        return decomp(input, target, *rest, **kwargs).to(input.dtype)
    return run


def _max_unpool(op, decomp):
    """CPU raises for an index outside its output plane; the decomposition's index_put
    wrapped a negative one (-1 wrote the last element). The check stays on the device
    (raised at the next synchronization, as CUDA's device assert)."""
    def run(x, indices, output_size, *rest):
        plane = 1
        for size in output_size:
            plane *= int(size)
        if indices.numel():
            ok = ((indices >= 0) & (indices < plane)).all()
            sizes = "x".join(str(int(v)) for v in output_size)
            torch._assert_async(ok, f"Found an invalid max index (output volumes are of size {sizes})")
        return decomp(x, indices, output_size, *rest)
    return run


_WRAPPERS = {"aten::huber_loss": _huber_loss, "aten::max_unpool2d": _max_unpool, "aten::max_unpool3d": _max_unpool,
             "aten::_native_batch_norm_legit": _batch_norm, "aten::native_batch_norm": _batch_norm,
             "aten::isin.Tensor_Tensor": _isin, "aten::isin.Tensor_Tensor_out": _isin,
             "aten::isin.Scalar_Tensor": _isin, "aten::isin.Scalar_Tensor_out": _isin}


def _name(op) -> str:
    s = op._schema
    return s.name + ("." + s.overload_name if s.overload_name else "")


def _has(name: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)


def eligible(op) -> bool:
    """Whether `op` should get a decomposition kernel for tpu."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return False
    n = _name(op)
    if n in _EXCLUDED:
        return False
    if any(_has(n, k) for k in ("PrivateUse1", "CompositeImplicitAutograd",
                                "CompositeExplicitAutograd",
                                "CompositeExplicitAutogradNonFunctional")):
        return False
    # Views: a return that aliases an input without writing it.
    for r in op._schema.returns:
        if r.alias_info is not None and not r.alias_info.is_write:
            return False
    return True


def _host(op, args, kwargs, why):
    """The CPU round trip of the C++ fallback, for a call a decomposition declined."""
    n = _name(op)
    if os.environ.get("TPU_FALLBACK") == "error":
        raise RuntimeError(f"torch_tpu: {n} has no native tpu lowering for these arguments "
                           f"({why}) and TPU_FALLBACK=error forbids the CPU fallback")
    with _lock:
        first = n not in fallbacks
        fallbacks[n] = fallbacks.get(n, 0) + 1
    if first:
        warnings.warn(f"torch_tpu: {n} runs on the CPU fallback ({why}); this copies its "
                      "tensors through the host")
    device = None
    host = {}  # id(cpu copy) -> tpu original

    def down(t):
        nonlocal device
        if isinstance(t, torch.Tensor) and t.device.type == "tpu":
            device = device or t.device
            c = t.cpu()
            host[id(c)] = t
            return c
        return t

    cargs, ckwargs = pytree.tree_map(down, (args, kwargs))
    # A factory's device (triu_indices has no tensor argument) is the CPU's for the call,
    # else it would dispatch back here; its result goes to the device asked for.
    if isinstance(ckwargs.get("device"), (str, torch.device)) and torch.device(ckwargs["device"]).type == "tpu":
        device = device or torch.device(ckwargs["device"])
        ckwargs = dict(ckwargs, device=torch.device("cpu"))
    out = op(*cargs, **ckwargs)
    # Written arguments (in-place, out=) go back to their tpu tensors.
    for i, a in enumerate(op._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        c = cargs[i] if i < len(cargs) else ckwargs.get(a.name)
        for ct in pytree.tree_leaves(c):
            if isinstance(ct, torch.Tensor) and id(ct) in host:
                t = host[id(ct)]
                if t.shape != ct.shape:
                    t.resize_(ct.shape)
                t.copy_(ct)

    def up(t):
        if isinstance(t, torch.Tensor):
            if id(t) in host:
                return host[id(t)]
            return t.to(device) if device is not None else t
        return t
    return pytree.tree_map(up, out)


def _written_returns(op) -> list:
    """(return index, argument index, argument name) for each return that aliases an
    argument the op writes (out=, in-place)."""
    s = op._schema
    pairs = []
    for ri, r in enumerate(s.returns):
        if r.alias_info is None or not r.alias_info.is_write:
            continue
        for ai, a in enumerate(s.arguments):
            if (a.alias_info is not None and a.alias_info.is_write
                    and set(a.alias_info.before_set) == set(r.alias_info.before_set)):
                pairs.append((ri, ai, a.name))
    return pairs


def _same_memory(a, b) -> bool:
    """is_set_to without its op call (which has no tpu kernel)."""
    return (a.untyped_storage()._cdata == b.untyped_storage()._cdata
            and a.storage_offset() == b.storage_offset() and a.shape == b.shape
            and a.stride() == b.stride() and a.dtype == b.dtype)


def _into_written(op, pairs, args, kwargs, r):
    """Some decompositions return their result without writing the argument the op
    writes: an upcasting wrapper around out= computes into a float32 copy of `out` and
    returns that, cast back (reflection_pad1d.out in bfloat16 left `out` unwritten). The
    result goes into the argument here, which is what the op returns."""
    many = len(op._schema.returns) > 1
    rs = list(r) if many else [r]
    for ri, ai, name in pairs:
        dest = kwargs[name] if name in kwargs else (args[ai] if ai < len(args) else None)
        got = rs[ri]
        if (isinstance(dest, torch.Tensor) and isinstance(got, torch.Tensor) and got is not dest
                and not _same_memory(dest, got)):
            if dest.shape != got.shape:
                dest.resize_(got.shape)
            dest.copy_(got)
            rs[ri] = dest
    return tuple(rs) if many else rs[0]


def _complex_refusal(op):
    """The error CPU's kernel of `op` raises for complex values (the lowered kernels'
    table), or None where it takes them."""
    from . import _C
    s = op._schema
    base = s.name.split("::", 1)[1].rstrip("_")
    kind = _C._complex_refusal(base + ("." + s.overload_name if s.overload_name else ""), base)
    return {1: NotImplementedError, 2: RuntimeError}.get(kind)


# c10's ScalarType numbers of the dtypes integral_refusal_for reads.
_INTEGRAL_CODES = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.bool: 11,
                   torch.float8_e5m2: 23, torch.float8_e4m3fn: 24, torch.float8_e5m2fnuz: 25,
                   torch.float8_e4m3fnuz: 26, torch.uint16: 27, torch.uint32: 28, torch.uint64: 29}
# Their names as c10 (and so CPU's errors) spells them.
_C10_NAMES = {torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int", torch.int64: "Long",
              torch.bool: "Bool", torch.float8_e5m2: "Float8_e5m2", torch.float8_e4m3fn: "Float8_e4m3fn",
              torch.float8_e5m2fnuz: "Float8_e5m2fnuz", torch.float8_e4m3fnuz: "Float8_e4m3fnuz",
              torch.uint16: "UInt16", torch.uint32: "UInt32", torch.uint64: "UInt64"}


def _integral_refusal(op, t):
    """The error CPU's kernel of `op` raises when its first tensor argument `t` is bool, an
    integer dtype, float8 or uint16/32/64 it leaves out (the lowered kernels' table), or None."""
    from . import _C
    code = _INTEGRAL_CODES.get(t.dtype)
    if code is None:
        return None
    s = op._schema
    base = s.name.split("::", 1)[1].rstrip("_")
    kind = _C._integral_refusal(base + ("." + s.overload_name if s.overload_name else ""), base, code)
    return {1: NotImplementedError, 2: RuntimeError}.get(kind)


def _check_out_dtype(op, args, kwargs):
    """An out= op told its dtype writes an out of that dtype (CPU's kernels check it)."""
    dtype, out = kwargs.get("dtype"), kwargs.get("out")
    if dtype is not None and isinstance(out, torch.Tensor) and out.dtype != dtype:
        raise RuntimeError(f"{_name(op)}: expected out tensor to have dtype {dtype}, but got {out.dtype} instead")


def _kernel(op, decomp):
    pairs = _written_returns(op)
    names = [a.name for a in op._schema.arguments]
    dtype_out = "dtype" in names and "out" in names
    check = _CHECKS.get(_name(op))
    refusal = _complex_refusal(op)

    def kernel(*args, **kwargs):
        if check is not None:
            check(args, kwargs)
        if dtype_out:
            _check_out_dtype(op, args, kwargs)
        if refusal is not None:
            for t in pytree.tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor) and t.is_complex():
                    raise refusal(f"{_name(op)}: not implemented for '{t.dtype}' "
                                  "(CPU refuses complex values too)")
        first = next((t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)), None)
        if first is not None:
            integral = _integral_refusal(op, first)
            if integral is not None:
                raise integral(f"{_name(op)}: not implemented for '{_C10_NAMES[first.dtype]}' "
                               "(CPU's kernel refuses it too)")
        active = getattr(_state, "active", None)
        if active is None:
            active = _state.active = set()
        if op in active:
            return _host(op, args, kwargs, "its decomposition calls it again")
        active.add(op)
        try:
            r = decomp(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the CPU kernel decides what is an error
            if isinstance(e, RuntimeError) and "same device" in str(e):
                raise  # operands on two devices: CUDA's error, not a round trip that mixes them
            lines = str(e).strip().splitlines() or [""]
            return _host(op, args, kwargs, f"its decomposition failed: {type(e).__name__}: "
                         f"{lines[0][:200]}")
        finally:
            active.discard(op)
        if r is NotImplemented:
            return _host(op, args, kwargs, "its decomposition declined these arguments")
        return _into_written(op, pairs, args, kwargs, r) if pairs else r
    return untraced(kernel)


def register() -> int:
    """Installs decomposition kernels for the eligible ops; returns how many."""
    global _lib
    if _lib is not None or os.environ.get("TPU_DECOMPOSITIONS", "1") == "0":
        return len(registered)
    from torch._decomp import decomposition_table
    _lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - kept for the process
    for op, decomp in list(decomposition_table.items()):
        if not eligible(op):
            continue
        s = op._schema
        wrap = _WRAPPERS.get(_name(op))
        _lib.impl(s.name.split("::", 1)[1] + ("." + s.overload_name if s.overload_name else ""),
                  _kernel(op, wrap(op, decomp) if wrap else decomp), "PrivateUse1")
        registered.append(_name(op))
    return len(registered)
