"""Bounded dynamic shapes in eager DeferAndFuse: one fused program for every size.

A tensor marked with `mark_dynamic(t, dim, min, max)` is, at the first eager op that
touches it under DeferAndFuse, padded on the device to its bound (a small per-size
program, as compiled mode pads its inputs) and wrapped in a `BoundedTensor`: PyTorch
sees the true sizes, while every op runs on the padded value, so each recorded program
and the fused graph they form have the bound's shapes and one text for every size. The
true sizes are program operands (0-d int64 tensors, one per size value).

Each op on a BoundedTensor goes through compiled mode's rules (bounded.py), not a copy
of them: the op becomes a one-node FX graph with symbolic sizes (the symbol's range is
the marked bounds), `check_graph` refuses ops not known right across a dynamic
dimension, and `_rewrite` adds the masks (padding set to the op's identity before it
reduces or contracts), the true sizes where a size is a value (mean's divisor), and
the masks of outputs with a flattened dynamic dimension (carried by the output). The
rewritten graph runs on the padded values, recorded like any eager op; it is built once
per op and symbolic signature.

Sizes that Python code reads (`x.shape[1]`) are `BoundedInt`s: ints that remember their
symbol, so `torch.arange(t)` and `x.view(b, t, ...)` stay bounded. Sizes that C++ passes
back as plain ints (autograd's sum_to_size views) are matched to the inputs' symbols by
value; an ambiguous or inconsistent match raises NotImplementedError, never guesses.
"""
import collections
import contextlib
import functools
import itertools
import logging
import threading

import sympy
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from .. import _C
from .._meta import untraced
from . import bounded
from .execution_mode import EagerMode
from .bounded_ops import _dyn_dims, _expr, _structural

aten = torch.ops.aten
_DEFER_AND_FUSE = EagerMode.DEFER_AND_FUSE.value

# -- symbols: per marked bounds, numbered by value within an op, in one ShapeEnv ---------

class _State(threading.local):
    suspended = 0  # inside compiled mode's bounded graphs
    ints = ()      # the BoundedInts passed to the torch function being run


_STATE = _State()
_ENV = None
_FAKE = None
_SYMS = {}          # (min, max, k) -> SymInt of the k-th symbol of those bounds (hint: the bound)
_MARKED = {}        # sympy symbol -> (min, max) as marked
_RANGES = {}        # sympy symbol -> (min, max) of its values
_SIZE_TENSORS = {}  # (symbol, value, device) -> 0-d int64 tpu tensor


def _env():
    global _ENV, _FAKE
    if _ENV is None:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        _ENV = ShapeEnv()
        _FAKE = FakeTensorMode(shape_env=_ENV)
        # No dispatch cache: an entry made while a refused op's guards held would outlive
        # _restored_env's rollback and let the next call of that op through, unguarded.
        _FAKE.cache_enabled = False
    return _ENV


def _symbol(lo: int, hi: int, k: int = 0, least: int = 0) -> torch.SymInt:
    """The k-th symbol of the marked bounds [lo, hi]: dimensions marked alike get the
    same symbol where their sizes are equal, the next ones where not (_Renamer). With
    `least`, one whose sizes start there: what a static index or slice past the marked
    minimum holds for (_host_checked_index), kept by the ops after it."""
    low = max(lo, 2, least)  # sizes 0 and 1 broadcast differently: never one symbol with 2..
    key = (lo, hi, k) if low == max(lo, 2) else (lo, hi, k, low)
    if key not in _SYMS:
        from torch._dynamo.source import ConstantSource
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StrictMinMaxConstraint
        from torch.utils._sympy.value_ranges import ValueRanges
        env = _env()
        name = "_".join(map(str, key))
        s = env.create_symbol(hi, ConstantSource(f"tpu_dynamic_{name}"),
                              dynamic_dim=DimDynamic.DYNAMIC,
                              constraint_dim=StrictMinMaxConstraint(vr=ValueRanges(low, hi),
                                                                    warn_only=False))
        # The hint is the bound: a guard that holds only for the size seen first (a size
        # compared with a static one) fails here instead of being baked in.
        _SYMS[key] = env.create_symintnode(s, hint=hi)
        _RANGES[s] = (low, hi)
        _MARKED[s] = (lo, hi)
    return _SYMS[key]


class _Renamer:
    """Symbols by value within one op (or one tensor): per marked bounds, the k-th
    distinct size met, in argument and dimension order, gets the k-th symbol. Sizes
    marked alike meet as one symbol where equal and as two where not (a query of 5 and
    a key of 7), and the op's graph is the same at every step whose sizes compare the
    same way. A size that some argument has from a narrowed symbol (sizes from 4 on:
    x[:, 2:]) gets the narrowed one for all (`leaves`: the op's arguments)."""

    def __init__(self, leaves=()):
        self.seen, self.count, self.least = {}, {}, {}
        for a in leaves:
            syms = a._values.items() if isinstance(a, BoundedTensor) else \
                a.values.items() if isinstance(a, BoundedInt) else ()
            for x, v in syms:
                key = (_MARKED[x], v)
                self.least[key] = max(self.least.get(key, 0), _RANGES[x][0])

    def __call__(self, s, value):
        key = (_MARKED[s], value)
        if key not in self.seen:
            least = max(self.least.get(key, 0), _RANGES[s][0])
            count_key = (key[0], least)
            k = self.count.get(count_key, 0)
            self.count[count_key] = k + 1
            self.seen[key] = _symbol(*key[0], k, least).node.expr
        return self.seen[key]

    def exprs(self, exprs, values):
        """(exprs, values) in this op's symbols."""
        sub = {}
        for e in exprs:
            for x in sorted(sympy.sympify(e).free_symbols, key=str):
                if x not in sub:
                    sub[x] = self(x, values[x])
        if all(k == v for k, v in sub.items()):
            return list(exprs), {x: values[x] for x in sub}
        return [sympy.sympify(e).xreplace(sub) for e in exprs], {sub[x]: values[x] for x in sub}

    def leaf(self, a):
        if isinstance(a, BoundedTensor):
            exprs, values = self.exprs(a._exprs, a._values)
            if exprs == a._exprs and values == a._values:
                return a
            return BoundedTensor(a._inner, exprs, values, a._mask)
        if isinstance(a, BoundedInt):
            (e,), values = self.exprs([a.symbol], a.values)
            return BoundedInt(int(a), e, values)
        return a


def _size_tensor(s, value: int, device):
    key = (s, value, str(device))
    if key not in _SIZE_TENSORS:
        # An upload, not a program: the pending graph takes it as an operand.
        _SIZE_TENSORS[key] = torch.tensor(value, dtype=torch.int64).to(device)
    return _SIZE_TENSORS[key]


def _bounds():
    return {s: sympy.Integer(hi) for s, (_, hi) in _RANGES.items()}


def _value(e, values) -> int:
    return int(sympy.sympify(e).xreplace({s: sympy.Integer(v) for s, v in values.items()}))


# -- the tensor -------------------------------------------------------------------------------

class BoundedInt(int):
    """A true size that remembers its symbol (what `x.shape[d]` gives for a dynamic d)."""

    def __new__(cls, value, symbol, values):
        r = super().__new__(cls, value)
        r.symbol = symbol   # its expression of the symbols
        r.values = values   # the values of the symbols in it
        return r


class BoundedSize(tuple):
    """`x.shape` of a BoundedTensor: true sizes, BoundedInt where dynamic."""

    def __repr__(self):  # printed as the shape it stands for
        return f"torch.Size({[int(s) for s in self]})"

    __str__ = __repr__

    def numel(self):
        n = 1
        for s in self:
            n *= int(s)
        return n


class BoundedTensor(torch.Tensor):
    """A tensor at its true sizes whose value lives padded to the bound in `_inner`.

    `_exprs`: each dimension's size as a polynomial of the symbols; `_values`: the true
    value of each symbol; `_mask`: validity of `_inner` where a dimension is compound
    (a flattened dynamic one), None where it follows from the shape.
    """
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, inner, exprs, values, mask=None):
        true = [_value(e, values) for e in exprs]
        r = torch.Tensor._make_wrapper_subclass(cls, true, _layout_strides(inner, true),
                                                dtype=inner.dtype, device=inner.device,
                                                requires_grad=False)
        r._inner, r._exprs, r._values, r._mask = inner, list(exprs), dict(values), mask
        return r

    def __repr__(self):
        return f"BoundedTensor({_unpad(self)!r}, dynamic={self._exprs})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def _layout_strides(inner, true):
    """The wrapper's strides: laid out as the padded value is, so that PyTorch's layout
    decisions on the wrapper (is_contiguous, whether reshape can be a view) hold for the
    padded value the op runs on. A transposed value must not claim contiguous strides:
    .contiguous() would return it as it is and a later view of the padded value fail."""
    if inner.is_contiguous():
        return bounded._contiguous_strides(true)
    from torch._prims_common import is_non_overlapping_and_dense_or_false as dense
    if not dense(inner):
        # A slice or an expand: its own strides, which a true-size view can never merge
        # across a padded dimension (reshape then copies, as the padded value needs).
        return list(inner.stride())
    # Dense in another order (a transpose): dense strides of the true sizes in that order.
    strides, acc = [0] * inner.dim(), 1
    for d in sorted(range(inner.dim()), key=lambda d: (inner.stride(d), -d)):
        strides[d] = acc
        acc *= max(true[d], 1)
    return strides


# Padded copies of marked tensors (by storage): a write into one would not reach the
# marked tensor.
_ENTRIES = {}


def _remember_entry(inner):
    from torch.multiprocessing.reductions import StorageWeakRef
    for k in [k for k, ref in _ENTRIES.items() if ref.expired()]:
        del _ENTRIES[k]
    _ENTRIES[inner.untyped_storage()._cdata] = StorageWeakRef(inner.untyped_storage())


def _writes_a_marked_copy(a) -> bool:
    """Whether `a` is a plain tensor viewing the padded copy of a marked tensor (a slice
    of static size along the marked dimension, xt[:, :2])."""
    if not isinstance(a, torch.Tensor) or isinstance(a, BoundedTensor) or a.device.type != "tpu":
        return False
    ref = _ENTRIES.get(a.untyped_storage()._cdata)
    return ref is not None and not ref.expired()


def _check_inplace(func, args):
    """In-place pointwise ops (linear's bias add_ on its matmul's result, `h += x`) run
    on the padded value: the valid part gets the true values, the padding stays padding,
    and views of it see the write as they share its storage. Other in-place ops, writes
    into a plain tensor and writes into the padded copy of a marked tensor are refused."""
    schema = func._schema
    self_ = args[0] if args else None
    writes = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    ok = (torch.Tag.pointwise in func.tags or func in bounded._UNTAGGED_POINTWISE) and len(writes) == 1 and \
        writes[0].name == schema.arguments[0].name and isinstance(self_, BoundedTensor)
    if ok:
        ref = _ENTRIES.get(self_._inner.untyped_storage()._cdata)
        if ref is not None and not ref.expired():
            raise NotImplementedError(
                f"torch_tpu bounded dynamism: {func} writes into a tensor marked with "
                "mark_dynamic (or a view of it) in eager DeferAndFuse; use its out-of-place "
                "form")
        return
    raise NotImplementedError(
        f"torch_tpu bounded dynamism: {func} writes into a tensor with a dynamic dimension "
        "in eager DeferAndFuse; use its out-of-place form")


def _unpad(t: BoundedTensor) -> torch.Tensor:
    """The true-size value, a view of the padded one's valid prefix."""
    if not all(_prefix_size(e) for e in t._exprs):
        raise NotImplementedError(
            f"torch_tpu bounded dynamism: a tensor of the compound dynamic shape "
            f"{tuple(t._exprs)} cannot be read outside the padded program; view it back to "
            "its marked dimensions first")
    x = t._inner
    for d, e in enumerate(t._exprs):
        if e.free_symbols:
            x = x.narrow(d, 0, _value(e, t._values))
    return x


def _prefix_size(e) -> bool:
    """A size whose valid part is the padded dimension's prefix: static, a symbol, or a
    symbol plus a constant (x[:, 2:], x[:, :-1]; not 2*s, a flattened (2, s))."""
    e = sympy.sympify(e)
    if not e.free_symbols or isinstance(e, sympy.Symbol):
        return True
    sym, const = e.as_independent(*e.free_symbols, as_Add=True)[::-1]
    return isinstance(sym, sympy.Symbol) and const.is_Integer


def to_bounded(t: torch.Tensor) -> torch.Tensor:
    """The BoundedTensor of a tensor marked with mark_dynamic (made once per tensor)."""
    cached = getattr(t, "_tpu_bounded", None)
    # The padded copy is stale once the storage was written: through the base or another
    # view (they share t's version counter), or possibly through .data (which does not:
    # reading it drops the copy, _BoundedMode). It is also made again when t's
    # requires_grad changed since (mark_dynamic makes it: a requires_grad_() after the
    # mark gave a copy outside autograd, and x's gradient was lost).
    if getattr(cached, "bounded", None) is not None and \
            getattr(t, "_tpu_bounded_version", None) == t._version and \
            getattr(t, "_tpu_bounded_grad", None) == t.requires_grad:
        return cached.bounded
    # (a loaded tensor's is an empty OrderedDict: see _Cached)
    info = getattr(t, "_tpu_dynamism", {})
    exprs, values = _marked_exprs(t)
    padded = []
    for d, n in enumerate(t.shape):
        if d in info:
            lo, hi = info[d]
            if not lo <= n <= hi:
                raise ValueError(f"torch_tpu bounded dynamism: size {n} of dimension {d} is "
                                 f"outside the bounds [{lo}, {hi}] (torch_tpu.dynamism.mark_dynamic)")
            if n < 2:
                raise NotImplementedError(
                    f"torch_tpu bounded dynamism: size {n} of dimension {d} is below 2; sizes 0 "
                    "and 1 broadcast differently and cannot share the program of [2, max]")
            padded.append(hi)
        else:
            padded.append(n)
    with bounded._strict():  # per size, like compiled mode's input padding
        inner = bounded._pad(t.detach(), padded)
    b = BoundedTensor(inner, exprs, values)
    if t.requires_grad:
        b = _Enter.apply(t, b)
        _note_exprs(b)
    t._tpu_bounded = _Cached(b)  # lives as long as the marked tensor
    if inner.untyped_storage()._cdata != t.untyped_storage()._cdata:
        _remember_entry(inner)  # a copy (at the bound, t itself: writes reach it)
    t._tpu_bounded_version = t._version
    t._tpu_bounded_grad = t.requires_grad
    return b


class _Cached:
    """A marked tensor's BoundedTensor, kept on it. Pickled (torch.save, deepcopy) as an
    empty OrderedDict, which torch.load's weights-only loader takes in any process: the
    copy is made again from the tensor (a weakref here made torch.save of a marked tensor
    fail)."""

    def __init__(self, bounded=None):
        self.bounded = bounded

    def __reduce__(self):
        return (collections.OrderedDict, ())


def _marked_exprs(t):
    """The sizes of a marked tensor as expressions, and the values of their symbols."""
    info, rename = t._tpu_dynamism, _Renamer()
    exprs = [rename(_symbol(*info[d]).node.expr, n) if d in info else sympy.Integer(n)
             for d, n in enumerate(torch.Tensor.size(t))]
    return exprs, {e: n for e, n in zip(exprs, torch.Tensor.size(t)) if e.free_symbols}


class _Enter(torch.autograd.Function):
    """Marked input -> its BoundedTensor; the gradient comes back at the true sizes."""

    @staticmethod
    def forward(ctx, t, b):
        return b

    @staticmethod
    def backward(ctx, g):
        return (_unpad(g) if isinstance(g, BoundedTensor) else g), None


# -- one op ---------------------------------------------------------------------------------

_SIZE_LIST_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                  aten.expand.default, aten.new_zeros.default, aten.new_ones.default,
                  aten.new_empty.default, aten.new_full.default, aten.full.default,
                  aten.zeros.default, aten.ones.default, aten.empty.memory_format,
                  aten.slice_backward.default, aten.select_backward.default}
# Ops that return no tensor and read no values: they see the padded tensors.
_SHAPE_QUERIES = {aten._fused_sdp_choice.default} if hasattr(aten, "_fused_sdp_choice") else set()

_GRAPHS = {}  # signature -> _OpGraph


def _dispatch(func, args, kwargs):
    if func is aten._to_copy.default and kwargs.get("device") is not None and \
            torch.device(kwargs["device"]).type != args[0]._inner.device.type:
        # Leaving the device: the padded value moves as it is (no per-size program
        # slices it) and the caller gets the view of its valid prefix.
        t = args[0]
        return _unpad(BoundedTensor(func(t._inner, **kwargs), t._exprs, t._values, t._mask))
    if func.namespace == "c10d":
        # A collective (dist.all_reduce and the like): no program of ours to pad. It runs
        # on the true-size values, views of the padded ones' valid prefixes, so an
        # in-place result lands in the padded value and ranks whose sizes differ fail as
        # they would with NCCL.
        unpadded = lambda a: _unpad(a) if isinstance(a, BoundedTensor) else a  # noqa: E731
        return func(*tree_map(unpadded, args), **tree_map(unpadded, kwargs))
    if func is aten.is_same_size.default:
        return list(args[0].shape) == list(args[1].shape)
    if func in _SHAPE_QUERIES:
        return func(*tree_map(lambda a: a._inner if isinstance(a, BoundedTensor) else a, args),
                    **tree_map(lambda a: a._inner if isinstance(a, BoundedTensor) else a, kwargs))
    inplace = func._schema.is_mutable
    if inplace:
        _check_inplace(func, args)
    leaves, spec = tree_flatten((args, kwargs))
    rename = _Renamer(leaves + list(_STATE.ints))
    leaves = [rename.leaf(a) for a in leaves]
    values = {}
    for a in leaves:
        if isinstance(a, BoundedTensor):
            values.update(a._values)
    for b in _STATE.ints:
        values.update(rename.leaf(b).values)
    leaves = _sizes_as_symbols(func, leaves, spec, values)
    leaves = _promote_plain(func, leaves, values)
    if func in _INDEX_OPS:
        leaves, spec, values = _host_checked_index(func, leaves, spec, values)
    key = (func, spec, tuple(_signature(a) for a in leaves))
    g = _GRAPHS.get(key)
    if g is None:
        g = _OpGraph(func, leaves, spec, values)
        _GRAPHS[key] = g
    if inplace and leaves[0]._inner is not args[0]._inner:
        # _promote_plain padded it again: the write would land in a copy.
        raise NotImplementedError(
            f"torch_tpu bounded dynamism: {func} writes into a tensor whose static size meets "
            "a dynamic one in eager DeferAndFuse; use its out-of-place form")
    out = g.run(leaves, values)
    if inplace:
        return args[0]  # its padded value was written in place
    if func in _VIEW_OPS and isinstance(leaves[0], BoundedTensor) and isinstance(out, BoundedTensor):
        _remember_view(leaves[0], out)
    return out


_INDEX_OPS = {aten.select.int, aten.slice.Tensor, aten.select_backward.default,
              aten.slice_backward.default}


def _host_checked_index(func, leaves, spec, values):
    """select/slice (and their gradients) at a static index along a dynamic dimension:
    an index past the marked minimum (x[:, 5], x[:, -3], x.narrow(1, 4, 2)) holds only for
    some sizes. The index is checked against the true size here, at each call (CPU's
    error where it is out of range), and the op's graph is built for the sizes from the
    least one it holds for up to the bound: the same padded shapes, so one more program
    per such index, reused at every size. A slice from a static start that reaches the
    true size (x[:, 2:], x[:, 2:100]: CPU clamps the end) is built for the sizes that
    leave it at least 2 long (1 would broadcast), for the one size leaving it 1 long, and
    as x[:, 0:0] where it is empty: at most three programs per start.
    Other cases are left to the op's rules."""
    unchanged = leaves, spec, values
    args, kwargs = tree_unflatten(leaves, spec)
    names = [a.name for a in func._schema.arguments]
    a = {a.name: a.default_value for a in func._schema.arguments if a.has_default_value()}
    a.update(zip(names, args))
    a.update(kwargs)
    backward = func in (aten.select_backward.default, aten.slice_backward.default)
    if backward:
        sizes = list(a["input_sizes"])
        d = a["dim"] % len(sizes)
        size = sizes[d]
        if not isinstance(size, _Sym):
            return unchanged
        e = size.expr
    else:
        x = a["self"]
        if not isinstance(x, BoundedTensor):
            return unchanged
        d = a["dim"] % x.dim()
        e = x._exprs[d]
    if not isinstance(e, sympy.Symbol) or e not in values:
        return unchanged  # a compound size (s - 1): left to the rules
    n = values[e]
    if func in (aten.select.int, aten.select_backward.default):
        idx = a["index"]
        if not isinstance(idx, int) or (backward and idx < 0):
            return unchanged  # (a negative index's gradient lands at n + idx)
        if not backward and not -n <= idx < n:
            # CPU's error (type and message), from the op at the true sizes
            true = torch.empty([_value(s, x._values) for s in x._exprs], device="meta")
            func(true, a["dim"], idx)
        least = idx + 1 if idx >= 0 else -idx
    else:
        start, end, step = a["start"], a["end"], a["step"]
        start = 0 if start is None else start
        end = _OPEN if end is None else end
        if not (isinstance(start, int) and isinstance(end, int) and step == 1 and
                0 <= start <= end):
            return unchanged
        if end <= n:
            # in range (x[:, 4:6] at 6 too): the same static slice at every size from its
            # end on; only an end past the true size takes the clamped path below
            least = end
        elif n - start >= 2 and start > 0:
            least = start + 2  # to the true size: open, at least 2 long
            if end != _OPEN:
                args, kwargs, spec = _with_arg(func, args, kwargs, "end", _OPEN)
        elif start >= n:
            least = 0  # empty (CPU clamps the start too): one program, x[:, 0:0]
            args, kwargs, spec = _with_arg(func, args, kwargs, "start", 0)
            args, kwargs, spec = _with_arg(func, args, kwargs, "end", 0)
        elif start > 0:
            least = end = n  # 1 long: static, for the size start + 1
            args, kwargs, spec = _with_arg(func, args, kwargs, "end", n)
        else:
            return unchanged  # x[:, :k] with k past the true size is x itself
        leaves = tree_flatten((args, kwargs))[0]
    if least > n or least <= _RANGES[e][0]:
        return leaves, spec, values  # not held here (the rules refuse), or held at every size
    new = _narrowed(e, least)
    sub = {e: new}
    out = []
    for v in leaves:
        if isinstance(v, BoundedTensor) and e in v._values:
            v = BoundedTensor(v._inner, [sympy.sympify(s).xreplace(sub) for s in v._exprs],
                              {sub.get(k, k): m for k, m in v._values.items()}, v._mask)
        elif isinstance(v, _Sym):
            v = _Sym(sympy.sympify(v.expr).xreplace(sub))
        out.append(v)
    return out, spec, {sub.get(k, k): m for k, m in values.items()}


_OPEN = 2 ** 63 - 1  # a slice's end that is the size (x[:, 2:])


def _with_arg(func, args, kwargs, name, value):
    """(args, kwargs, spec) of a call with the argument `name` set to value."""
    pos = [a.name for a in func._schema.arguments].index(name)
    args, kwargs = list(args), dict(kwargs)
    if pos < len(args):
        args[pos] = value
    else:
        kwargs[name] = value
    args = tuple(args)
    return args, kwargs, tree_flatten((args, kwargs))[1]


def _narrowed(s, least):
    """A symbol like `s` (same marked bounds) whose sizes start at `least`."""
    return _symbol(*_MARKED[s], 0, least).node.expr


# Plain tensors at a true dynamic size that met a bounded one and had to be padded per
# size (their graph is then built per size): autograd's mean backward, for one.
padded_per_size = {}


def _promote_plain(func, leaves, values):
    """Tensors whose static dimension, aligned with a bounded argument's dynamic one, has
    its true size: the same tensor padded to the bound (what the static program computes
    on its prefix). Plain tpu tensors, and bounded ones with such a static dimension (the
    rows of bmm(expanded grad, k) come out static: autograd's sizes are plain ints). A
    broadcast dimension (stride 0) is a free view; anything else is a per-size pad
    recorded in the graph, counted in `padded_per_size`. A compound size (s - 1, the
    gradient of x[:, 1:]) gets the mask of its valid prefix."""
    if not any(isinstance(a, BoundedTensor) for a in leaves):
        return leaves
    out = list(leaves)
    for i, p in enumerate(leaves):
        if not isinstance(p, torch.Tensor) or p.dim() == 0 or p.device.type != "tpu":
            continue
        was_bounded = isinstance(p, BoundedTensor)
        if was_bounded and (p._mask is not None or not _structural_exprs(p._exprs)):
            continue  # its valid part is not a prefix: the new padding's mask is unknown
        exprs = list(p._exprs) if was_bounded else [sympy.Integer(n) for n in p.shape]
        dyn, unmatched = [], []
        for d, e in _aligned(func, leaves, i):
            if exprs[d].free_symbols or not e.free_symbols or p.shape[d] == 1:
                continue  # already dynamic, or met by a static size or a broadcast
            if p.shape[d] == _value(e, values):
                exprs[d] = e
                dyn.append(d)
            else:
                unmatched.append((d, e))
        unmatched = [(d, e) for d, e in unmatched if not exprs[d].free_symbols]
        if unmatched:
            # The padded shapes would disagree (some kernels' shape checks do not see it).
            d, e = unmatched[0]
            raise NotImplementedError(
                f"torch_tpu bounded dynamism: {func} meets the dynamic size {e} with the static "
                f"size {p.shape[d]} of an argument (dimension {d} of {tuple(p.shape)}), often a "
                "gradient that autograd sized with plain ints, in eager DeferAndFuse. Run this "
                "code with marked sizes in Strict or Debug mode (TPU_LAUNCH_BLOCKING=1), or "
                "compile it with torch.compile(fn, backend=torch_tpu.TpuBackend(dynamism=True))")
        if not dyn:
            continue
        inner = p._inner if was_bounded else p
        bnd = _bounds()
        padded = [int(e.xreplace(bnd)) for e in exprs]
        if all(inner.stride(d) == 0 for d in dyn):
            inner = inner.as_strided(padded, inner.stride(), inner.storage_offset())
        else:
            padded_per_size[str(func)] = padded_per_size.get(str(func), 0) + 1
            pads = []
            for n, m in zip(reversed(inner.shape), reversed(padded)):
                pads += [0, m - n]
            inner = torch.nn.functional.pad(inner, pads)
        vals = {**p._values, **values} if was_bounded else values
        mask = None if _structural_exprs(exprs) else _prefix_mask(exprs, vals, padded, inner.device)
        out[i] = BoundedTensor(inner, exprs, vals, mask)
    return out


def _structural_exprs(exprs):
    return all(isinstance(e, sympy.Symbol) or not e.free_symbols for e in exprs)


def _prefix_mask(exprs, values, padded, device):
    """Validity of a padded tensor whose true data is a prefix in every dimension; the
    sizes are operands, so its program is the same at every size."""
    m = None
    for d, e in enumerate(exprs):
        if e.free_symbols:
            c = torch.arange(padded[d], device=device) < _size_tensor(e, _value(e, values), device)
            c = c.view([padded[d] if k == d else 1 for k in range(len(padded))])
            m = c if m is None else m & c
    return m.expand(padded)


def _aligned(func, leaves, i):
    """(dimension of leaves[i], the expression it meets) pairs, where the op's semantics
    pair it with a dimension of a bounded argument: broadcasting for pointwise ops, the
    contraction for mm/bmm, the same shape for anything else."""
    p = leaves[i]
    if torch.Tag.pointwise in func.tags:
        return [(p.dim() - k, b._exprs[-k]) for b in leaves if isinstance(b, BoundedTensor)
                for k in range(1, min(p.dim(), b.dim()) + 1)]
    if func is aten.embedding_dense_backward.default and i == 0:
        # The gradient is shaped (indices..., D): its leading dimensions are the indices'.
        idx = leaves[1]
        return list(enumerate(idx._exprs)) if isinstance(idx, BoundedTensor) else []
    if func in (aten.mm.default, aten.bmm.default) and i in (0, 1):
        other = leaves[1 - i]
        if not isinstance(other, BoundedTensor):
            return []
        pairs = [(p.dim() - 1, other._exprs[-2])] if i == 0 else [(p.dim() - 2, other._exprs[-1])]
        if func is aten.bmm.default:
            # The batch: matmul of a transposed (s, B, D) by a weight expands the weight
            # to the true batch size, with plain ints.
            pairs.append((0, other._exprs[0]))
        return pairs
    return [(d, e) for b in leaves if isinstance(b, BoundedTensor) and b.shape == p.shape
            for d, e in enumerate(b._exprs)]


def _signature(a):
    if isinstance(a, BoundedTensor):
        return ("b", a.dtype, tuple(a._exprs), a._mask is not None)
    if isinstance(a, torch.Tensor):
        return ("t", a.dtype, tuple(a.shape), a.device.type)
    if isinstance(a, _Sym):
        return ("s", a.expr)
    return ("c", type(a), a if isinstance(a, (int, float, bool, str, type(None), torch.dtype,
                                              torch.device, torch.layout, torch.memory_format))
            else repr(a))


class _Sym:
    """A size argument that is a polynomial of the symbols."""

    def __init__(self, expr):
        self.expr = expr


def _sizes_as_symbols(func, leaves, spec, values):
    """Plain ints of a size-list argument that are true dynamic sizes, as _Sym."""
    if not values:
        return leaves
    if func not in _SIZE_LIST_OPS:
        return [_Sym(a.symbol) if isinstance(a, BoundedInt) else a for a in leaves]
    pos = 1 if func not in (aten.full.default, aten.zeros.default, aten.ones.default,
                            aten.empty.memory_format) else 0
    flat_pos = list(_size_arg(spec, pos))  # where the size list's ints are among the leaves
    sizes = [leaves[i] for i in flat_pos]
    src = leaves[0] if pos == 1 and isinstance(leaves[0], BoundedTensor) else None
    src_exprs = None if src is None else tuple(src._exprs)
    sizes = tuple(int(n) for n in sizes)
    bests = _resolve_sizes(func, sizes, src_exprs,
                           tuple(sorted(values.items(), key=lambda kv: str(kv[0]))))
    if len(bests) > 1 and func in _VIEW_OPS:
        # Equal values tie ((2, 2, V) from (2*s - 2, V) at s = 3): autograd views a
        # gradient back to the shape a forward view came from, which it remembers.
        hint = _VIEWED.get((src_exprs, sizes))
        bests = [c for c in bests if hint is not None and _same_exprs(c, hint)]
    if len(bests) > 1:
        bests = _by_forward_inputs(bests)
    if len(bests) != 1:
        raise NotImplementedError(
            f"torch_tpu bounded dynamism: cannot tell which sizes of {func}{sizes} are the "
            f"dynamic ones (input sizes {src_exprs}); pass x.shape[d] itself for a dynamic size")
    best = bests[0]
    new = list(leaves)
    for i, c, n in zip(flat_pos, best, sizes):
        new[i] = -1 if int(n) == -1 else _Sym(c) if c.free_symbols else int(c)
    return [_Sym(a.symbol) if isinstance(a, BoundedInt) else a for a in new]


# Where a backward node's forward inputs were bounded: grad_fn.metadata[_EXPRS_KEY] maps
# the output's number to its sizes (noted in _BoundedMode and to_bounded).
_EXPRS_KEY = "torch_tpu_bounded_exprs"


def _note_exprs(out):
    """Notes the sizes of the bounded outputs of a call that autograd recorded."""
    for t in tree_flatten(out)[0]:
        if isinstance(t, BoundedTensor) and t.grad_fn is not None:
            t.grad_fn.metadata.setdefault(_EXPRS_KEY, {})[t.output_nr] = tuple(t._exprs)


def _by_forward_inputs(bests):
    """Of tied readings of a size list met in a backward (sum's gradient expanded to
    (4, 4, 4) from (4, s, 1) at s = 4: (4, s, 4) or (4, s, s)), those whose dynamic
    dimensions are those of one of the node's forward inputs: autograd sizes the gradient
    of an input by that input's sizes, as plain ints."""
    node = torch._C._current_autograd_node()
    if node is None:
        return bests
    pattern = lambda exprs: tuple(bool(sympy.sympify(e).free_symbols) for e in exprs)  # noqa: E731
    seen = set()
    for fn, nr in node.next_functions:
        if fn is None:
            continue
        exprs = fn.metadata.get(_EXPRS_KEY, {}).get(nr)
        if exprs is not None:
            seen.add(pattern(exprs))
    kept = [c for c in bests if pattern(c) in seen]
    return kept or bests


@functools.lru_cache(maxsize=4096)
def _resolve_sizes(func, sizes, src_exprs, values_items):
    """Which ints of a size list are dynamic sizes (memoized: the search uses sympy)."""
    values = dict(values_items)
    # The sizes a dimension may be: the symbols, and the input's dynamic sizes with their
    # factors (viewing (2*s - 2, V) back to (2, s - 1, V) takes s - 1 from 2*(s - 1)).
    bases = set(values)
    for e in src_exprs or ():
        if e.free_symbols:
            bases.add(sympy.expand(e))
            bases.update(sympy.expand(f) for f, _ in sympy.factor_list(e)[1] if f.free_symbols)
    cands = []
    for i, n in enumerate(sizes):
        opts = [sympy.Integer(int(n))]
        # A multiple of a dynamic size may be a flattened dynamic dimension (2*s).
        for base in sorted(bases, key=str):
            v = _value(base, values)
            if int(n) > 0 and v > 0 and int(n) % v == 0:
                c = sympy.expand(sympy.Integer(int(n) // v) * base)
                if c not in opts:
                    opts.append(c)
        cands.append(opts)
    want = None if src_exprs is None else sympy.Mul(*src_exprs)
    viewing = src_exprs is not None and func in _VIEW_OPS
    bests, best_score = [], -1
    for combo in itertools.product(*cands):
        score = 0
        if viewing:
            known = sympy.Mul(*[c for c, n in zip(combo, sizes) if int(n) != -1])
            if -1 in [int(n) for n in sizes]:
                inferred = sympy.cancel(want / known)
                if sympy.fraction(inferred)[1] != 1:
                    continue
                combo = tuple(inferred if int(n) == -1 else c for c, n in zip(combo, sizes))
            elif sympy.expand(known - want) != 0:
                continue
            # A view keeps a dynamic dimension inside one group of dimensions: the more
            # group boundaries (prefix products) it shares with its input, the likelier.
            score = len(_prefix_products(combo) & _prefix_products(src_exprs))
        elif src_exprs is not None and func is aten.expand.default:
            if not all(c == e or e == 1 or int(n) == -1 for c, e, n in
                       zip(reversed(combo), reversed(src_exprs), reversed(sizes))):
                continue
            score = sum(c == e for c, e in zip(reversed(combo), reversed(src_exprs)))
        elif src_exprs is not None and func is aten.slice_backward.default:
            # The sliced input's sizes: each a constant off the gradient's (s - 1 -> s).
            score = sum(sympy.expand(c - e).is_number for c, e in zip(combo, src_exprs))
        elif src_exprs is not None and func is aten.select_backward.default:
            # The selected input's sizes: the gradient's with the selected one inserted
            # (the gradient of qkv[0] of MultiheadAttention's packed projection).
            if not any(list(combo[:k] + combo[k + 1:]) == list(src_exprs)
                       for k in range(len(combo))):
                continue
        if score > best_score:
            bests, best_score = [combo], score
        elif score == best_score and combo not in bests:
            bests.append(combo)
    return tuple(bests)  # the likeliest readings: one, or a tie


_VIEW_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
# (a view's output sizes, its input's true sizes) -> the input's sizes, or None where two
# views disagree: how a gradient is viewed back (_sizes_as_symbols).
_VIEWED = {}


def _remember_view(src, out):
    key = (tuple(out._exprs), tuple(src.shape))
    seen = _VIEWED.get(key, src._exprs)
    _VIEWED[key] = tuple(src._exprs) if seen is not None and _same_exprs(seen, src._exprs) else None


def _same_exprs(a, b):
    return len(a) == len(b) and all(sympy.expand(x - y) == 0 for x, y in zip(a, b))


def _prefix_products(exprs):
    out, acc = set(), sympy.Integer(1)
    for e in exprs:
        acc = sympy.expand(acc * e)
        out.add(acc)
    return out


def _size_arg(spec, pos):
    """args[pos] of a call with this spec, each leaf replaced by its index."""
    args = _UNFLAT.get(spec)
    if args is None:
        args = _UNFLAT[spec] = tree_unflatten(list(range(spec.num_leaves)), spec)[0]
    return args[pos]


_UNFLAT = {}  # spec -> its args with leaf indices: where each argument's leaves are


@contextlib.contextmanager
def _quiet(log):
    was, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = was


@contextlib.contextmanager
def _restored_env():
    """What an op's shape checks taught the ShapeEnv is forgotten after it: a refused op
    must not leave a symbol specialized (s -> 128) for the next ones."""
    env = _ENV
    saved = (dict(env.replacements), dict(env.var_to_range), dict(env.axioms), len(env.guards))
    try:
        yield
    finally:
        env.replacements.clear()
        env.replacements.update(saved[0])
        env.var_to_range.clear()
        env.var_to_range.update(saved[1])
        env.axioms.clear()
        env.axioms.update(saved[2])
        del env.guards[saved[3]:]
        env._update_version_counter()
        # SymNodes cache their expression per replacements version: one made during
        # the op (s -> 16) would outlive the rollback in the fakes that saw it.
        env._replacements_version_counter += 1
        # ShapeEnv memoizes evaluate_expr and the guard recorders per expression: a
        # remembered answer would skip the guard next time, and the op get through.
        for f in vars(type(env)).values():
            if hasattr(f, "cache_clear"):
                f.cache_clear()


class _OpGraph:
    """One op as a graph with symbolic sizes, rewritten by bounded.py for padded values."""

    def __init__(self, func, leaves, spec, values):
        _env()
        g = torch.fx.Graph()
        nodes, fakes = [], []
        self.kinds = []
        with _FAKE:
            for i, a in enumerate(leaves):
                if isinstance(a, BoundedTensor):
                    f = torch.empty([_symint(e) for e in a._exprs], dtype=a.dtype, device=a.device)
                elif isinstance(a, torch.Tensor):
                    f = torch.empty(a.shape, dtype=a.dtype, device=a.device)
                elif isinstance(a, _Sym):
                    f = _symint(a.expr)
                else:
                    nodes.append(a)
                    self.kinds.append("c")
                    continue
                p = g.placeholder(f"in{i}")
                p.meta["val"] = f
                nodes.append(p)
                fakes.append(f)
                self.kinds.append("b" if isinstance(a, BoundedTensor) else
                                  "s" if isinstance(a, _Sym) else "t")
            fargs, fkwargs = tree_unflatten(
                [f if k != "c" else a for f, k, a in
                 zip(_expand(fakes, self.kinds), self.kinds, leaves)], spec)
            out = self._fake_run(func, fargs, fkwargs, values)
        nargs, nkwargs = tree_unflatten(nodes, spec)
        n = g.call_function(func, tuple(nargs), dict(nkwargs))
        n.meta["val"] = out
        if isinstance(out, (list, tuple)):
            import operator
            outs = []
            for i, o in enumerate(out):
                x = g.call_function(operator.getitem, (n, i))
                x.meta["val"] = o
                outs.append(x)
            self.multi = type(out)
        else:
            outs = [n]
            self.multi = None
        g.output(tuple(outs))
        gm = torch.fx.GraphModule(torch.nn.Module(), g)
        bounded.check_graph(gm)
        self.fake_outs = [x.meta["val"] for x in outs]
        phs = [p for p in g.nodes if p.op == "placeholder"]
        self.mask_in = [i for i, p in enumerate(phs)
                        if _dyn_dims(p.meta["val"]) and not _structural(p.meta["val"])]
        dev = next((a.device for a in leaves if isinstance(a, torch.Tensor)), torch.device("tpu"))
        b = bounded._Builder(_bounds(), dev)
        new_outs, masks = bounded._rewrite(gm, b, {phs[i] for i in self.mask_in})
        self.syms = sorted(b.sizes, key=str)
        self.out_kinds, extra = [], []
        for v, m in zip(self.fake_outs, masks):
            if not _dyn_dims(v):
                self.out_kinds.append(("plain", None))
            elif _structural(v):
                self.out_kinds.append(("bounded", None))
            elif m is None or m is bounded._UNKNOWN:
                self.out_kinds.append(("unknown", None))
            else:
                self.out_kinds.append(("bounded", len(extra)))
                extra.append(m)
        b.g.output(tuple(new_outs) + tuple(extra))
        self.n_out = len(new_outs)
        self.gm = torch.fx.GraphModule(torch.nn.Module(), b.g)
        self.func = func

    @classmethod
    def _fake_run(cls, func, fargs, fkwargs, values):
        """The op on the fake arguments, refused where its shapes hold only for some
        sizes. Some C++ kernels read sizes as ints (constant_pad_nd), which pins the
        symbol to its hint: the op's Python decomposition, if any, is tried next."""
        from torch._decomp import decomposition_table
        first = None
        for f in (func, decomposition_table.get(func)):
            if f is None:
                break
            # FakeTensorMode logs a failed meta kernel's traceback: the failure is ours to
            # report (or the decomposition's to fix).
            with _restored_env(), _quiet(logging.getLogger("torch._subclasses.fake_tensor")):
                guards = len(_ENV.guards)
                try:
                    out = f(*fargs, **fkwargs)
                    cls._check_guards(func, guards, values)
                    return out
                except _SizeMismatch:
                    raise
                except Exception as e:
                    first = first or e
        if isinstance(first, NotImplementedError) and "bounded dynamism" in str(first):
            raise first
        # a size mismatch between the bound and a static size
        raise NotImplementedError(
            f"torch_tpu bounded dynamism: {func} cannot run with a dynamic size there "
            f"({type(first).__name__}: {str(first).splitlines()[0] if str(first) else ''})") from first

    @staticmethod
    def _check_guards(func, before, values):
        """Refuses the op if a guard its shapes needed does not hold at every size within
        the bounds: at each corner of its symbols' ranges (each symbol at its low and its
        high bound on its own: Eq(s0, s1) holds where both are low)."""
        for guard in _ENV.guards[before:]:
            syms = sorted(guard.expr.free_symbols & set(_RANGES), key=str)
            if len(syms) > 1 and guard.expr.xreplace(
                    {x: sympy.Integer(values[x]) for x in syms if x in values}) == sympy.false:
                # Dynamic sizes the op relates, wrong at these sizes: a shape error, as on
                # the CPU. (One size against a static one stays a refusal, as ever: some C++
                # kernels read a size as an int, and the decomposition may do without.)
                raise _SizeMismatch(
                    f"torch_tpu bounded dynamism: {func} needs {guard.expr} of its dynamic sizes, "
                    "which are " + ", ".join(f"{x} = {values[x]} (marked {_MARKED[x]})"
                                             for x in syms if x in values))
            corners = itertools.product(*[_RANGES[x] for x in syms]) if len(syms) <= 8 else \
                [[_RANGES[x][k] for x in syms] for k in (0, 1)]
            if any(guard.expr.xreplace(dict(zip(syms, map(sympy.Integer, c)))) != sympy.true
                   for c in corners):
                why = "a dynamic size meets a static one there"
                if isinstance(guard.expr, (sympy.Eq, sympy.Ne)) and sympy.Integer(1) in guard.expr.args:
                    # a broadcast check: a size like s - 1 reaches 1 at the marked minimum
                    why = "a dynamic size can be 1 within the marked bounds, where it would " \
                          "broadcast: raise the marked minimum"
                raise NotImplementedError(
                    f"torch_tpu bounded dynamism: {func} would hold only for some sizes "
                    f"({guard.expr}); {why}")

    def run(self, leaves, values):
        bnd = _bounds()
        ins, masks = [], []
        for a, k in zip(leaves, self.kinds):
            if k == "b":
                ins.append(a._inner)
            elif k == "t":
                ins.append(a)
            elif k == "s":
                ins.append(int(a.expr.xreplace(bnd)))
        for i in self.mask_in:
            t = [a for a, k in zip(leaves, self.kinds) if k != "c"][i]
            if not isinstance(t, BoundedTensor) or t._mask is None:
                raise NotImplementedError(
                    f"torch_tpu bounded dynamism: an argument of {self.func} has the compound "
                    f"dynamic shape {tuple(getattr(t, '_exprs', t.shape))} whose valid part "
                    "cannot be told")
            masks.append(t._mask)
        dev = next((x.device for x in ins if isinstance(x, torch.Tensor)), torch.device("tpu"))
        for s in self.syms:
            if s not in values:
                raise RuntimeError(f"torch_tpu bounded dynamism: no value for the size {s}")
            ins.append(_size_tensor(s, values[s], dev))
        outs = self.gm(*ins, *masks)
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        res = []
        for (kind, m), v, o in zip(self.out_kinds, self.fake_outs, outs[:self.n_out]):
            if kind == "plain" or not isinstance(o, torch.Tensor):
                res.append(o)
            else:
                mask = outs[self.n_out + m] if m is not None else None
                res.append(BoundedTensor(o, [_expr(s) for s in v.shape], values, mask))
        return self.multi(res) if self.multi is not None else res[0]


class _SizeMismatch(ValueError):
    """Dynamic sizes that an op needs equal (or related) are not, at these sizes."""


def _expand(fakes, kinds):
    it = iter(fakes)
    return [next(it) if k != "c" else None for k in kinds]


def _symint(e):
    e = sympy.sympify(e)
    if not e.free_symbols:
        return int(e)
    return _env().create_symintnode(e, hint=int(e.xreplace(_bounds())))


# -- entering: marked tensors and bounded sizes under DeferAndFuse ----------------------------

# Factories whose padded result's prefix is the true-size result.
_PREFIX_FACTORIES = {torch.arange, torch.zeros, torch.ones, torch.full, torch.empty}


class _BoundedMode(TorchFunctionMode):
    """Turns marked tensors into BoundedTensors, and reads sizes as BoundedInts, while
    the eager mode is DeferAndFuse (never while Dynamo traces: compiled mode has its own
    bounded graphs)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _active():
            return func(*args, **kwargs)
        out = self._bounded_call(func, types, args, kwargs)
        if torch.is_grad_enabled() and isinstance(out, (torch.Tensor, tuple, list)):
            _note_exprs(out)  # how its backward will size the gradients (_by_forward_inputs)
        return out

    def _bounded_call(self, func, types, args, kwargs):
        if func in (torch.Tensor.size, torch.Tensor.shape.__get__) and _dynamic(args[0]):
            shape = _bounded_size(args[0])
            if func is torch.Tensor.size and (len(args) > 1 or "dim" in kwargs):
                return shape[args[1] if len(args) > 1 else kwargs["dim"]]
            return shape
        if func in _HOST_READS and args and _dynamic(args[0]):
            return _host_read(func, args, kwargs)
        if func in (torch.Tensor.unbind, torch.unbind) and args and _dynamic(args[0]):
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if isinstance(_bounded_size(args[0])[dim], BoundedInt):
                return _unbind(args[0], dim)
        if func in _NEW_FACTORIES and _dynamic(args[0]):
            # x.new_zeros(...): the factory with x's dtype and device. Its sizes are then
            # known as the caller wrote them (a BoundedInt dynamic, a plain int static),
            # not matched by value against x's sizes (a static 4 met a size of 4).
            kwargs = dict(kwargs)
            size = args[1:] if func is not torch.Tensor.new_full else args[1:2]
            size = size or (kwargs.pop("size"),)
            size = size[0] if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)) else size
            rest = (args[2],) if func is torch.Tensor.new_full and len(args) > 2 else ()
            kw = dict({"dtype": args[0].dtype, "device": args[0].device}, **kwargs)
            return self._bounded_call(_NEW_FACTORIES[func], types, (tuple(size),) + rest, kw)
        if func == torch.Tensor.data.__get__ and _marked(args[0]):
            args[0]._tpu_bounded_version = None  # may be written through: padded again
        name = getattr(func, "__name__", "")
        if _ENTRIES and args and (name.startswith("__i") or name.endswith("_") and
                                  not name.endswith("__") and name not in _NOT_WRITES) and \
                _writes_a_marked_copy(args[0]):
            raise NotImplementedError(
                f"torch_tpu bounded dynamism: {name} writes into a view of a tensor marked "
                "with mark_dynamic in eager DeferAndFuse (the write would not reach the "
                "tensor); use its out-of-place form")
        if name in _NO_ENTRY or not _involved(args, kwargs):
            return func(*args, **kwargs)  # attributes, autograd calls, nothing bounded
        leaves, spec = tree_flatten((args, kwargs))
        if any(_marked(a) for a in leaves):
            leaves = [to_bounded(a) if _marked(a) else a for a in leaves]
            args, kwargs = tree_unflatten(leaves, spec)
        ints = [a for a in leaves if isinstance(a, BoundedInt)]
        if ints:  # in one set of symbols: sizes marked alike are one symbol where equal
            rename = _Renamer(leaves)
            leaves = [rename.leaf(a) for a in leaves]
            args, kwargs = tree_unflatten(leaves, spec)
            ints = [a for a in leaves if isinstance(a, BoundedInt)]
        if func in (torch.prod, torch.Tensor.prod) and _Prod.applies(args, kwargs):
            return _Prod.apply(_Prod.cast(args, kwargs), *_Prod.dims(args, kwargs))
        if ints and func in _PREFIX_FACTORIES:
            return _factory(func, args, kwargs, ints)
        if ints and getattr(func, "__name__", "") in _ARITHMETIC:
            # A size used as a value: the size operand, so the program stays the same.
            dev = next((a.device for a in leaves if isinstance(a, torch.Tensor)
                        and a.device.type == "tpu"), None)
            if dev is not None:
                leaves = [_size_tensor(a.symbol, int(a), dev) if isinstance(a, BoundedInt) else a
                          for a in leaves]
                args, kwargs = tree_unflatten(leaves, spec)
                ints = []
        prev = _STATE.ints
        _STATE.ints = ints
        try:
            return func(*args, **kwargs)
        finally:
            _STATE.ints = prev


# The mode stays installed, and a compiled function that runs code eagerly (past a graph
# break: an optimizer's step) calls it there while Dynamo looks for frames to compile: it
# compiled the mode's frame into graphs of its own (set_grad_enabled, each `p.grad` read,
# up to its recompile limit), and the first one's call closed a fused training step
# early (two programs a step). The mode's frames are never user code; the call it passes
# on is met as it would be without the mode.
untraced(_BoundedMode.__torch_function__, calls=False)
untraced(_BoundedMode._bounded_call)


# Reads of the values on the host: they see the true-size value (a view of the padded
# one's valid prefix), as .cpu() and .item() do; they failed (tolist on a subclass;
# printing computes masked_select over the whole tensor).
_HOST_READS = {torch.Tensor.tolist, torch.Tensor.__repr__, torch.Tensor.__format__}


def _host_read(func, args, kwargs):
    # A marked tensor's own storage holds its true value (writes into its padded copy
    # are refused).
    t = args[0]
    return func(_unpad(t) if isinstance(t, BoundedTensor) else t, *args[1:], **kwargs)


def _unbind(t, dim=0):
    """unbind (iterating rows) along a dynamic dimension: the rows of the true-size value
    (one program cannot have a row count that varies; a row at a static index past the
    marked minimum is not in every size's range), plain tensors as a marked tensor's."""
    return (_unpad(t) if isinstance(t, BoundedTensor) else t).unbind(dim)


_NEW_FACTORIES = {torch.Tensor.new_zeros: torch.zeros, torch.Tensor.new_ones: torch.ones,
                  torch.Tensor.new_empty: torch.empty, torch.Tensor.new_full: torch.full}

_ARITHMETIC = {"__mul__", "__rmul__", "__add__", "__radd__", "__sub__", "__rsub__",
               "__truediv__", "__rtruediv__", "mul", "add", "sub", "div", "true_divide",
               "multiply", "subtract", "divide"}

# In-place methods that write no values.
_NOT_WRITES = {"requires_grad_", "detach_", "share_memory_", "retain_grad_"}

# Calls that neither compute on a marked tensor nor read its size.
_NO_ENTRY = {"__get__", "__set__", "backward", "register_hook", "retain_grad",
             "requires_grad_", "__setstate__", "__reduce_ex__", "__deepcopy__", "data_ptr",
             "untyped_storage", "_is_view", "is_contiguous", "dim", "__len__", "numel"}


def _marked(a) -> bool:
    return isinstance(a, torch.Tensor) and not isinstance(a, BoundedTensor) and \
        bool(getattr(a, "_tpu_dynamism", None))


def _dynamic(a) -> bool:
    return isinstance(a, BoundedTensor) or _marked(a)


def _bounded_size(t) -> BoundedSize:
    """True sizes, BoundedInt where dynamic (read from the marks of a plain marked tensor)."""
    exprs, values = (t._exprs, t._values) if isinstance(t, BoundedTensor) else _marked_exprs(t)
    return BoundedSize(BoundedInt(_value(e, values), e, {x: values[x] for x in e.free_symbols})
                       if e.free_symbols else int(e) for e in exprs)


def _factory(func, args, kwargs, ints):
    """A factory sized by a dynamic size: built at the bound, bounded by the symbol."""
    if func is torch.arange and len(args) != 1:
        raise NotImplementedError(
            f"torch_tpu bounded dynamism: {getattr(func, '__name__', func)} with a dynamic size "
            "argument is not supported in eager DeferAndFuse (supported: arange(n), zeros, ones, "
            "full, empty; other uses read it as a plain int)")
    bnd = _bounds()
    values = {x: v for b in ints for x, v in b.values.items()}
    true_args, true_kwargs, fill = args, kwargs, None
    if func is torch.full:  # a size as the fill value: the true size, filled in after
        args, kwargs = list(args), dict(kwargs)
        where = (args, 1) if len(args) > 1 else (kwargs, "fill_value")
        if isinstance(where[0].get(where[1]) if isinstance(where[0], dict) else where[0][1],
                      BoundedInt):
            fill, where[0][where[1]] = where[0][where[1]], 0
    padded = tree_map(lambda a: int(a.symbol.xreplace(bnd)) if isinstance(a, BoundedInt) else a,
                      (args, kwargs))
    out = func(*padded[0], **padded[1])
    if out.device.type != "tpu":
        return func(*true_args, **true_kwargs)  # a host tensor: its true size
    if fill is not None:
        out.fill_(_size_tensor(fill.symbol, int(fill), out.device))
    if not any(isinstance(a, BoundedInt) for a in tree_flatten((args, kwargs))[0]):
        return out  # the fill value was the only size
    return BoundedTensor(out, _factory_shape(func, args, ints), values)


def _factory_shape(func, args, ints):
    if func is torch.arange:
        return [ints[0].symbol]
    size = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else \
        (args if func is not torch.full else args[0])
    return [a.symbol if isinstance(a, BoundedInt) else sympy.Integer(int(a)) for a in size]


_MODE = None


@untraced
def _active() -> bool:
    # Compiled mode (Dynamo tracing, AOTAutograd, a bounded graph's call) has its own
    # bounded graphs: marked tensors stay plain there.
    if torch.compiler.is_compiling():  # first: Dynamo traces this mode and folds it here
        return False
    if _C.get_eager_mode() != _DEFER_AND_FUSE or _STATE.suspended:
        return False
    return torch._guards.TracingContext.try_get() is None


def _involved(args, kwargs) -> bool:
    """Whether a marked tensor or a BoundedInt is among the arguments (or in a list of
    them): a cheaper scan than flattening every call's arguments."""
    for group in (args, kwargs.values()):
        for a in group:
            if isinstance(a, BoundedInt) or _marked(a):
                return True
            if isinstance(a, (list, tuple)):
                for b in a:
                    if isinstance(b, BoundedInt) or _marked(b):
                        return True
    return False


@contextlib.contextmanager
def suspended():
    """Marked tensors stay plain inside (compiled mode's bounded graphs pad their own)."""
    _STATE.suspended += 1
    try:
        yield
    finally:
        _STATE.suspended -= 1


def outside_eager_bounds(fn):
    """`fn` (a compiled graph's callable, boxed or not) run with marked tensors plain."""
    def run(*args, **kwargs):
        with suspended():
            return fn(*args, **kwargs)
    if getattr(fn, "_boxed_call", False):
        run._boxed_call = True
    return run


def _value_selecting_backward(grad, dim, indices, sizes, keepdim):
    """The gradient of max/min/sort/topk/kthvalue/median along a static dimension of a
    bounded tensor: zeros at the bound with the gradient scattered into them. PyTorch's
    own (its composite kernel) makes the zeros with the true sizes as plain ints, which
    a bounded index cannot scatter into (the padded shapes disagree). Other gradients
    take PyTorch's kernel."""
    op = aten.value_selecting_reduction_backward.default
    d = dim % max(len(sizes), 1)
    if not isinstance(indices, BoundedTensor) or not _active() or \
            not isinstance(grad, torch.Tensor) or grad.device.type != "tpu":
        return op.decompose(grad, dim, indices, sizes, keepdim)
    if not isinstance(grad, BoundedTensor):
        # At the indices' true sizes (sum's gradient, expanded with plain ints): the
        # indices' sizes, padded as a pointwise op pads it (free for an expanded one).
        grad = _promote_plain(aten.mul.Tensor, [indices, grad], indices._values)[1]
        if not isinstance(grad, BoundedTensor):
            return op.decompose(grad, dim, indices, sizes, keepdim)
    g, i = (grad, indices) if keepdim else (grad.unsqueeze(d), indices.unsqueeze(d))
    if g._exprs[d].free_symbols or i._exprs != g._exprs:
        return op.decompose(grad, dim, indices, sizes, keepdim)  # refused there, by name
    exprs = list(g._exprs)
    exprs[d] = sympy.Integer(int(sizes[d]))
    bnd = _bounds()
    padded = [int(e.xreplace(bnd)) for e in exprs]
    # A constant at the bound: one program for every size (the plain zeros at the true
    # size would be padded per size).
    zeros = BoundedTensor(torch.zeros(padded, dtype=g.dtype, device=g._inner.device),
                          exprs, g._values)
    return zeros.scatter(d, i, g)


class _Prod(torch.autograd.Function):
    """prod along a static dimension of a bounded tensor that needs its gradient.
    PyTorch's backward for a tensor subclass (prod_safe_zeros_backward) cats a tensor of
    ones made with the true sizes as plain ints, which the bounded operand cannot meet;
    this one makes them like the input (bounded), with the same formula: the product of
    the elements before each one times the product of those after it (right with zeros)."""

    @staticmethod
    def applies(args, kwargs):
        x = args[0] if args else None
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        return isinstance(x, BoundedTensor) and isinstance(dim, int) and \
            x.requires_grad and torch.is_grad_enabled() and \
            not x._exprs[dim % x.dim()].free_symbols and \
            set(kwargs) <= {"dim", "keepdim", "dtype"} and len(args) <= 3

    @staticmethod
    def cast(args, kwargs):
        """The input in prod's `dtype`: the product is computed there, and the cast's
        gradient (autograd's) takes the gradient back to the input's dtype."""
        dtype = kwargs.get("dtype")
        return args[0] if dtype is None else args[0].to(dtype)

    @staticmethod
    def dims(args, kwargs):
        dim = args[1] if len(args) > 1 else kwargs["dim"]
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        return dim, keepdim

    @staticmethod
    def forward(ctx, x, dim, keepdim):
        ctx.save_for_backward(x)
        ctx.dim, ctx.keepdim = dim % x.dim(), keepdim
        return x.prod(dim, keepdim)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        d, n = ctx.dim, x.shape[ctx.dim]
        if not ctx.keepdim:
            grad = grad.unsqueeze(d)
        if n == 1:
            return grad.expand(x.shape), None, None
        ones = torch.ones_like(x.narrow(d, 0, 1))
        before = torch.cat([ones, x.narrow(d, 0, n - 1)], d).cumprod(d)
        after = torch.cat([ones, x.narrow(d, 1, n - 1).flip(d)], d).cumprod(d).flip(d)
        return grad * before * after, None, None


_LIB = None


def enable() -> None:
    """Installs the mode (once): called when a tensor is marked dynamic."""
    global _MODE, _LIB
    if _MODE is None:
        _MODE = _BoundedMode()
        _MODE.__enter__()
    if _LIB is None:
        # Above the Python key (a bounded gradient's zeros must be bounded too).
        _LIB = torch.library.Library("aten", "IMPL")
        _LIB.impl("value_selecting_reduction_backward", _value_selecting_backward,
                  "AutogradPrivateUse1")
