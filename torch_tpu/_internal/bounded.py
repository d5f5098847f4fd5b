"""Bounded dynamic shapes in compiled mode: one program for every size up to the bound.

A graph with dynamic sizes (bounded by `mark_dynamic`) is replayed once with every
dynamic dimension padded to its bound and the symbols set to their upper bounds, so the
recorded program has static shapes and the same text for every size: it is compiled
once. The true sizes are program operands (0-d int64 tensors, one per symbol). Where an
op reduces, contracts or mixes across a dynamic dimension, the padded part of its inputs
is first filled with the op's identity (`where(mask, x, fill)`: 0 for sums and matmuls,
-inf for softmax and amax, ignore_index for nll_loss targets), the mask being computed
in the program from the sizes; everything else is row-wise and leaves garbage only in
the padding. A size used as a value (mean's divisor, `x * t.shape[0]`, the backward of a
mean) is computed from the size operands, never taken from the bound. Outputs come back padded; the caller sees a view of their valid prefix.
Ops that move data along a dynamic dimension must keep each true element at its true
index (the valid part a prefix): a slice from a static start, a cat whose operands but
the last are static along it and scans (cumsum) do as they are; flip (gathered from
size-1-i), a right pad (moved from the bound to the valid part's end) and index (negative
indices wrapped by the true size, padded index positions reading 0) are rewritten so.
Tensors saved for the backward stay padded (with their mask, when a flattened dimension
makes the mask not follow from the shape).

Why not XLA's own bounded dynamism (`stablehlo.set_dimension_size`): the XLA CPU plugin
runs it, masking reductions and dots, but the dynamic sizes do not flow through the
per-op functions our fused programs call (tested: an elementwise op in its own function
loses them), and sizes baked into lowerings as constants (mean's divisor) would stay
wrong anyway (they need the same op-by-op care either way). So each op that touches a
dynamic dimension must be in a listed set (bounded_ops.py, checked when the graph is
lowered); any other raises NotImplementedError naming it rather than computing silently
wrong values.
"""
import contextlib
import operator

import sympy
import torch

from .bounded_ops import (_FILLS, _INDEX_SHAPED, _MASKED_OPS, _MEANS, _POSITIONAL, _SCANS,
                          _SCATTERS, _STATIC_DIM_OPS, _UNTAGGED_POINTWISE,
                          _dyn_dims, _is_out_dtype, _expr, _mean_dims, _polynomial, _refuse, _same_shape,
                          _structural, _tensor_overload, _val, _value_args, check_graph)

aten = torch.ops.aten

# -- the padded graph -------------------------------------------------------------------------
# Every tensor is replayed at its padded shape (symbols at their bounds). A tensor whose
# dynamic dimensions are each a bare symbol keeps its valid data in a prefix of each of
# them, so its validity mask follows from its shape and the sizes; a tensor with a
# compound dimension (2*s, a flattened batch) gets the mask of what it was viewed from.
# Ops that reduce or contract see masked inputs (filled with the reduction's identity).

_SANITIZE_FILL = {aten.amax.default: float("-inf"), aten.amin.default: float("inf"),
                  # all's identity is True (1 for a number); any's is False, the default 0
                  aten.all.default: 1, aten.all.dim: 1, aten.all.dims: 1}
_VIEW_LIKE = {aten.view.default, aten._unsafe_view.default, aten.reshape.default,
              aten.expand.default}
_SAME_MASK = {aten.clone.default, aten.detach.default, aten.alias.default,
              aten._to_copy.default, aten.contiguous.default,
              # constant tensors of their input's shape: its valid part is theirs
              aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
              aten.empty_like.default, aten.fill.Scalar}
_MOVES = {aten.t.default, aten.transpose.int, aten.permute.default, aten.unsqueeze.default,
          aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.select.int,
          aten.slice.Tensor}
_UNKNOWN = object()  # a mask that cannot be told (a compound dimension from another op)
_ALL_VALID = object()  # (_compound_mask: a static operand's, before the others')


def _eval(e, values) -> int:
    return int(e.xreplace(values))


class _Builder:
    """Builds the padded graph: the original ops plus masks where they are needed."""

    def __init__(self, bounds, device):
        self.g = torch.fx.Graph()
        self.bounds = bounds
        self.device = device
        self.sizes = {}  # symbol -> placeholder of its true size (0-d int64 tensor)

    def call(self, op, *args, **kwargs):
        return self.g.call_function(op, args, kwargs)

    def padded(self, v):
        return [_eval(_expr(s), self.bounds) for s in v.shape]

    def size_value(self, e):
        """A 0-d int64 tensor (or int) holding the polynomial `e` of the true sizes."""
        if isinstance(e, sympy.Integer):
            return int(e)
        if isinstance(e, sympy.Symbol):
            return self.sizes[e]
        if isinstance(e, sympy.Pow):
            parts = [self.size_value(e.base)] * int(e.exp)
        else:
            parts = [self.size_value(a) for a in e.args]
        acc = parts[0]
        for p in parts[1:]:
            if isinstance(acc, int):
                acc, p = p, acc
            if isinstance(e, sympy.Add):
                acc = self.call(aten.add.Scalar if isinstance(p, int) else aten.add.Tensor, acc, p)
            else:
                acc = self.call(aten.mul.Scalar if isinstance(p, int) else aten.mul.Tensor, acc, p)
        return acc

    def arith(self, op, a, c):
        """`a op c` for ints and 0-d (or broadcast) int64 tensor nodes."""
        if isinstance(a, int) and isinstance(c, int):
            return {"add": a + c, "mul": a * c, "floordiv": a // c, "mod": a % c}[op]
        if op == "floordiv":
            return self.call(aten.div.Tensor_mode, a, c, rounding_mode="floor")
        if op == "mod":
            return self.call(aten.remainder.Tensor if not isinstance(c, int) else
                             aten.remainder.Scalar, a, c) if not isinstance(a, int) else \
                self.call(aten.remainder.Tensor, self.call(aten.scalar_tensor.default, a,
                                                           dtype=torch.int64, device=self.device), c)
        if isinstance(a, int):
            a, c = c, a
        tensor_op = {"add": aten.add, "mul": aten.mul}[op]
        return self.call(tensor_op.Scalar if isinstance(c, int) else tensor_op.Tensor, a, c)

    def prefix_mask(self, v):
        """Validity of a tensor whose valid data sits at the start of every dimension (each
        index below its true size, a polynomial of the sizes): None when all are static."""
        shape = self.padded(v)
        m = None
        for d, s in enumerate(v.shape):
            if not isinstance(s, torch.SymInt):
                continue
            r = self.call(aten.arange.default, shape[d], dtype=torch.int64, device=self.device)
            c = self.call(aten.lt.Tensor, r, self.size_value(_expr(s)))
            c = self.call(aten.view.default, c, [shape[d] if i == d else 1 for i in range(len(shape))])
            m = c if m is None else self.call(aten.logical_and.default, m, c)
        return None if m is None else self.call(aten.expand.default, m, shape)

    def structural_mask(self, v):
        """Validity of a tensor whose dynamic dimensions are bare symbols (a prefix in
        each, below its size)."""
        return self.prefix_mask(v)


def _mean(b, n, args, kwargs, m_of):
    """mean over dynamic dimensions: the padded sum over the true count."""
    x = _val(n.args[0])
    dyn = [d for d in _mean_dims(n) if d in _dyn_dims(x)]
    if not dyn:
        return b.g.call_function(n.target, tuple(args), kwargs)
    args = list(args)
    args[0] = _filled(b, n, 0, args[0], m_of(n.args[0]), 0)
    out = b.g.call_function(n.target, tuple(args), kwargs)  # divides by the padded count
    padded = b.padded(x)
    count = 1
    for d in dyn:
        count *= padded[d]
    true_count = sympy.expand(sympy.Mul(*[_expr(x.shape[d]) for d in dyn]))
    if not _polynomial(true_count):
        _refuse(n.target, f"averages over the dynamic size {true_count}")
    true = b.size_value(true_count)
    return b.call(aten.div.Tensor, b.call(aten.mul.Scalar, out, count), true)


def _fill(b, x, m, value, dtype):
    if m is None:
        return x
    if m is _UNKNOWN:
        return _UNKNOWN
    if dtype == torch.bool:
        value = bool(value)
    elif not dtype.is_floating_point and abs(value) == float("inf"):
        info = torch.iinfo(dtype)
        value = info.min if value < 0 else info.max
    # A 0-d tensor of x's dtype, so that the result keeps it.
    v = b.call(aten.scalar_tensor.default, value, dtype=dtype, device=b.device)
    return b.call(aten.where.self, m, x, v)


def _rewrite(gm, b, mask_inputs):
    """Copies gm into b.g with masks; returns (outputs, masks of the outputs)."""
    env, masks = {}, {}
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for p in phs:
        env[p] = b.g.placeholder(p.name)
        env[p].meta = dict(p.meta)
    for s in sorted({e for p in phs for e in _symbols_of(_val(p))}, key=str):
        b.sizes[s] = b.g.placeholder(f"_tpu_size_{s}")
    mask_phs = {}
    for p in phs:
        if p in mask_inputs:
            mask_phs[p] = b.g.placeholder(f"_tpu_mask_{p.name}")
    for p in phs:
        v = _val(p)
        if not _dyn_dims(v):
            masks[p] = None
        elif p in mask_phs:
            masks[p] = mask_phs[p]
        else:  # each dynamic size a symbol, or a symbol + c: a prefix
            masks[p] = b.prefix_mask(v)
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        if n.op != "call_function":
            env[n] = b.g.node_copy(n, lambda a: env[a])
            masks[n] = None
            continue
        args = torch.fx.node.map_arg(n.args, lambda a: env[a])
        kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a])
        m_of = lambda a: masks.get(a) if isinstance(a, torch.fx.Node) else None  # noqa: E731
        if n.target is operator.getitem:
            src = m_of(n.args[0])
            masks[n] = src[n.args[1]] if isinstance(src, list) else None
            env[n] = b.call(operator.getitem, *args)
            _fix_structural(b, n, masks)
            continue
        op = n.target
        if op in _MASKED_OPS or op in _STATIC_DIM_OPS:
            args = _sanitize(b, n, list(args), m_of)
        if op is aten.index.Tensor:
            args = _index_args(b, n, list(args), m_of)
        if op in _INDEX_SHAPED:
            args = _index_shaped_args(b, n, list(args), m_of)
        if op in _SCATTERS:
            args = _scatter_args(b, n, list(args), m_of)
        if _is_out_dtype(op) and n.args[0] is aten.mm.default:
            # out_dtype(mm, int32, a, b): a matmul, its operands' padding set to 0.
            args = list(args)
            for i in (2, 3):
                args[i] = _filled(b, n, i, args[i], m_of(n.args[i]), 0)
        if op is aten.slice_backward.default and \
                isinstance(_val(n.args[1][n.args[2]]), torch.SymInt):
            args = list(args)  # the gradient's padding would land in the valid part
            args[0] = _filled(b, n, 0, args[0], m_of(n.args[0]), 0)
        # (arange's end, the other op taking a size as a number, is its length: at the bound)
        sized = _value_args(n) if isinstance(op, torch._ops.OpOverload) and (
            op in _FILLS or torch.Tag.pointwise in op.tags) else {}
        fill = None
        if sized:
            # A size used as a value: the true size, from the program's size operands (a
            # 0-d tensor where the op has a Tensor overload; filled in after a factory).
            args, kwargs = list(args), dict(kwargs)
            for k, v in sized.items():
                t = b.size_value(_expr(v))
                if op in _FILLS:
                    fill, t = t, 0
                if isinstance(k, int):
                    args[k] = t
                else:
                    kwargs[k] = t
            if op not in _FILLS:
                op = _tensor_overload(n, sized)
        if op in _RESHAPES and _scrambles(n):
            # The padded data read in row-major order is not the true data's order:
            # gathered so that each valid element sits at its own index.
            env[n] = _exact_reshape(b, n, args[0])
            env[n].meta = dict(n.meta)
            masks[n] = b.prefix_mask(_val(n))
            continue
        if op in _MEANS:
            env[n] = _mean(b, n, args, kwargs, m_of)
        elif op is aten.flip.default:
            env[n] = _flip(b, n, args[0])
        elif op is aten.select.int and not _plain_select(n):
            env[n] = _select(b, n, args[0])
        elif op is aten.select_backward.default and _dynamic_select_backward(n):
            env[n] = _select_backward(b, n, args[0])
        elif op is aten.slice.Tensor and isinstance(_val(n.args[2]) if len(n.args) > 2 else None,
                                                    torch.SymInt):
            env[n] = _gathered_slice(b, n, args[0])
        else:
            env[n] = b.g.call_function(op, tuple(args), kwargs)
        if fill is not None:
            env[n] = b.call(aten.fill.Tensor, env[n], fill)
        if op is aten.constant_pad_nd.default:
            env[n] = _pad_end(b, n, env[n])
        env[n].meta = dict(n.meta)
        # The output's mask.
        v = _val(n)
        if isinstance(v, (list, tuple)):
            first = _val(n.args[0]) if n.args and isinstance(n.args[0], torch.fx.Node) else None
            masks[n] = [b.structural_mask(x) if _structural(x) and _dyn_dims(x) else
                        None if not _dyn_dims(x) else
                        m_of(n.args[0]) if _same_shape(x, first) else _UNKNOWN for x in v]
        elif not _dyn_dims(v):
            masks[n] = None
        elif _structural(v):
            masks[n] = b.structural_mask(v)
        else:
            masks[n] = _compound_mask(b, n, m_of)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    vals = out.args[0]
    return [env[o] if isinstance(o, torch.fx.Node) else o for o in vals], \
        [masks.get(o) if isinstance(o, torch.fx.Node) else None for o in vals]


_RESHAPES = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}


def _scrambles(n) -> bool:
    """Whether a reshape of padded data puts valid elements at other indices than the
    reshape of the true data: a dynamic size that is not the outermost (non-1) dimension
    of its group of merged or split dimensions ((3, s) -> (3*s) reads row 1 at index 16,
    not s). (s, 3) -> (3*s) and (2*s, 4) -> (s, 8) keep every index."""
    src, dst = _val(n.args[0]), _val(n)
    if not isinstance(src, torch.Tensor) or not (_dyn_dims(src) or _dyn_dims(dst)):
        return False
    A, B = [_expr(s) for s in src.shape], [_expr(s) for s in dst.shape]
    if A == B:
        return False
    ranges = {}
    for s in list(src.shape) + list(dst.shape):
        if isinstance(s, torch.SymInt):
            env = s.node.shape_env
            for sym in s.node.expr.free_symbols:
                ranges[sym] = sympy.Integer(int(env.var_to_range[sym].upper))
    pad = lambda e: int(e.xreplace(ranges))  # noqa: E731
    groups, i, j = [], 0, 0
    while i < len(A) and j < len(B):
        gi, gj, pa, pb = [i], [j], A[i], B[j]
        i, j = i + 1, j + 1
        while sympy.expand(pa - pb) != 0:
            if pad(pa) < pad(pb):
                if i >= len(A):
                    return True  # (not told apart: gathered, which is always right)
                gi.append(i); pa *= A[i]; i += 1  # noqa: E702
            else:
                if j >= len(B):
                    return True
                gj.append(j); pb *= B[j]; j += 1  # noqa: E702
        groups.append((gi, gj))
    if any(e != 1 for e in A[i:] + B[j:]):
        return True
    for gi, gj in groups:
        for dims, ex in ((gi, A), (gj, B)):
            inner = [ex[d] for d in dims if ex[d] != 1][1:]
            if any(e.free_symbols for e in inner):
                return True
    return False


def _exact_reshape(b, n, x):
    """A reshape that gathers each valid element to its true index (padding: anything)."""
    src, dst = _val(n.args[0]), _val(n)
    A, B = [_expr(s) for s in src.shape], [_expr(s) for s in dst.shape]
    for e in A + B:
        if not _polynomial(e):
            _refuse(n.target, f"reshapes across the dynamic size {e}")
    P, Q = b.padded(src), b.padded(dst)
    # The true row-major index of each position of the output.
    lin, stride = 0, sympy.Integer(1)
    for d in reversed(range(len(Q))):
        if Q[d] == 1:
            continue
        r = b.call(aten.arange.default, Q[d], dtype=torch.int64, device=b.device)
        r = b.call(aten.view.default, r, [Q[d] if i == d else 1 for i in range(len(Q))])
        lin = b.arith("add", lin, b.arith("mul", r, b.size_value(sympy.expand(stride))))
        stride = stride * B[d]
    # Its index in the input (true sizes), then the input's padded row-major index.
    pos, t_stride, p_stride = 0, sympy.Integer(1), 1
    for d in reversed(range(len(A))):
        if P[d] != 1:
            a = b.arith("floordiv", lin, b.size_value(sympy.expand(t_stride)))
            if d > 0:
                a = b.arith("mod", a, b.size_value(A[d]))
            pos = b.arith("add", pos, b.arith("mul", a, p_stride))
        t_stride, p_stride = t_stride * A[d], p_stride * P[d]
    if isinstance(pos, int):  # no dimension but 1s: nothing moves
        return b.call(aten.reshape.default, x, Q)
    m = b.prefix_mask(dst)
    if m is not None:  # padding positions read element 0
        pos = b.call(aten.where.self, m, b.call(aten.expand.default, pos, Q),
                     b.call(aten.scalar_tensor.default, 0, dtype=torch.int64, device=b.device))
    pos = b.call(aten.reshape.default, b.call(aten.expand.default, pos, Q), [-1])
    flat = b.call(aten.reshape.default, x, [-1])
    return b.call(aten.reshape.default, b.call(aten.index_select.default, flat, 0, pos), Q)


def _fix_structural(b, n, masks):
    v = _val(n)
    if masks[n] is _UNKNOWN and _structural(v):
        masks[n] = b.structural_mask(v)


def _symbols_of(v):
    out = set()
    for s in ([v] if isinstance(v, torch.SymInt) else list(getattr(v, "shape", []))):
        if isinstance(s, torch.SymInt):
            out |= s.node.expr.free_symbols
    return out


def _flip(b, n, x):
    """flip: along a dynamic dimension, element i is element size-1-i (the padded flip
    would put the padding first), gathered so; static dimensions flip as they are."""
    v = _val(n.args[0])
    dims = sorted({d % v.dim() for d in n.args[1]})
    static = [d for d in dims if not isinstance(v.shape[d], torch.SymInt)]
    if static:
        x = b.call(aten.flip.default, x, static)
    shape = b.padded(v)
    for d in dims:
        if d in static:
            continue
        r = b.call(aten.arange.default, shape[d], dtype=torch.int64, device=b.device)
        last = b.arith("add", b.size_value(_expr(v.shape[d])), -1)
        i = b.call(aten.sub.Tensor, last, r)
        zero = b.call(aten.scalar_tensor.default, 0, dtype=torch.int64, device=b.device)
        i = b.call(aten.where.self, b.call(aten.ge.Scalar, i, 0), i, zero)  # padding reads 0
        x = b.call(aten.index_select.default, x, d, i)
    return x


def _plain_select(n) -> bool:
    """A select that reads the same element of the padded tensor (a static index >= 0,
    or a negative one along a static dimension)."""
    x, idx = _val(n.args[0]), _val(n.args[2])
    return isinstance(idx, int) and (idx >= 0 or not isinstance(x.shape[n.args[1] % x.dim()], torch.SymInt))


def _select(b, n, x):
    """select at the true index: a size (table[n-1]) or a negative index along a dynamic
    dimension (x[:, -1] counts from the true size, not the bound), gathered."""
    v, idx = _val(n.args[0]), _val(n.args[2])
    d = n.args[1] % v.dim()
    e = _expr(idx) if isinstance(idx, torch.SymInt) else _expr(v.shape[d]) + idx
    i = b.call(aten.view.default, b.size_value(sympy.expand(e)), [1])
    return b.call(aten.select.int, b.call(aten.index_select.default, x, d, i), d, 0)


def _dynamic_select_backward(n) -> bool:
    """select_backward along a dynamic dimension at an index from the end or a size."""
    sizes, idx = [_val(s) for s in n.args[1]], _val(n.args[3])
    return isinstance(sizes[n.args[2] % len(sizes)], torch.SymInt) and \
        (isinstance(idx, torch.SymInt) or idx < 0)


def _select_backward(b, n, g):
    """select_backward at the true index (x[:, -1]'s gradient): the gradient where the
    index along the padded dimension is the true one, zeros elsewhere."""
    out = _val(n)
    d, idx = n.args[2] % out.dim(), _val(n.args[3])
    e = _expr(idx) if isinstance(idx, torch.SymInt) else _expr(out.shape[d]) + idx
    shape = b.padded(out)
    r = b.call(aten.arange.default, shape[d], dtype=torch.int64, device=b.device)
    hit = b.call(aten.eq.Tensor, r, b.size_value(sympy.expand(e)))
    hit = b.call(aten.expand.default, b.call(aten.view.default, hit,
                                             [shape[d] if k == d else 1 for k in range(len(shape))]), shape)
    g = b.call(aten.expand.default, b.call(aten.unsqueeze.default, g, d), shape)
    return b.call(aten.where.self, hit, g, b.call(aten.zeros_like.default, g))


def _gathered_slice(b, n, x):
    """A slice of a static dimension from a size: element i is input element start +
    i*step at the true start (the padded length's tail, past the true length, reads the
    last element: don't-care)."""
    v, out = _val(n.args[0]), _val(n)
    d = n.args[1] % v.dim()
    step = n.args[4] if len(n.args) > 4 else n.kwargs.get("step", 1)
    r = b.call(aten.arange.default, b.padded(out)[d], dtype=torch.int64, device=b.device)
    r = b.call(aten.add.Tensor, b.call(aten.mul.Scalar, r, step), b.size_value(_expr(_val(n.args[2]))))
    r = b.call(aten.clamp.default, r, None, int(v.shape[d]) - 1)
    return b.call(aten.index_select.default, x, d, r)


def _pad_end(b, n, out):
    """constant_pad_nd with a right pad of a dynamic dimension: the padded op puts the pad
    after the bound, the true one right after the valid part; positions from the valid
    part's end on (pad, then don't-care) are set to the pad value."""
    x = _val(n.args[0])
    pads = list(n.args[1])
    value = n.args[2] if len(n.args) > 2 else n.kwargs.get("value", 0)
    shape = b.padded(_val(n))
    keep = None
    for k in range(len(pads) // 2):
        d = x.dim() - 1 - k
        if not isinstance(x.shape[d], torch.SymInt) or pads[2 * k + 1] <= 0:
            continue
        r = b.call(aten.arange.default, shape[d], dtype=torch.int64, device=b.device)
        # (a left crop, pads[2k] < 0, moves the valid part's end down by as much)
        c = b.call(aten.lt.Tensor, r, b.size_value(sympy.expand(_expr(x.shape[d]) + pads[2 * k])))
        c = b.call(aten.view.default, c, [shape[d] if i == d else 1 for i in range(len(shape))])
        keep = c if keep is None else b.call(aten.logical_and.default, keep, c)
    if keep is None:
        return out
    v = b.call(aten.scalar_tensor.default, value, dtype=x.dtype, device=b.device)
    return b.call(aten.where.self, keep, out, v)


def _index_args(b, n, args, m_of):
    """index.Tensor's indices for the padded tensor: a negative index along a dynamic
    dimension counts from the true size (not the bound), and padded index positions read
    element 0 (garbage there could be out of the padded buffer's range)."""
    x = _val(n.args[0])
    indices = []
    for d, (i, e) in enumerate(zip(n.args[1], args[1])):
        if isinstance(x.shape[d], torch.SymInt):
            zero = b.call(aten.scalar_tensor.default, 0, dtype=_val(i).dtype, device=b.device)
            wrapped = b.call(aten.add.Tensor, e, b.size_value(_expr(x.shape[d])))
            e = b.call(aten.where.self, b.call(aten.lt.Tensor, e, zero), wrapped, e)
        if m_of(i) is _UNKNOWN:
            raise NotImplementedError(
                f"torch_tpu bounded dynamism: index {d} of {n.target} has a dynamic dimension "
                f"whose valid part cannot be told ({_val(i).shape})")
        indices.append(_fill(b, e, m_of(i), 0, _val(i).dtype))
    args[1] = indices
    return args


def _index_shaped_args(b, n, args, m_of):
    """gather's index for the padded tensor: padded index positions read element 0, as
    index.Tensor's do (what is there, an arange's t - 1 - i, may be out of range; the
    bounds check would fail at every size but the bound)."""
    i = _INDEX_SHAPED[n.target]
    m = m_of(n.args[i])
    if m is _UNKNOWN:
        raise NotImplementedError(
            f"torch_tpu bounded dynamism: the index of {n.target} has a dynamic dimension "
            f"whose valid part cannot be told ({_val(n.args[i]).shape})")
    args[i] = _fill(b, args[i], m, 0, _val(n.args[i]).dtype)
    return args


def _scatter_args(b, n, args, m_of):
    """A scatter's index for the padded tensor: padded index positions write index 0 of
    their own (padding) row, never a valid one, and are never out of range."""
    m = m_of(n.args[2])
    if m is _UNKNOWN:
        raise NotImplementedError(
            f"torch_tpu bounded dynamism: the index of {n.target} has a dynamic dimension "
            f"whose valid part cannot be told ({_val(n.args[2]).shape})")
    args[2] = _fill(b, args[2], m, 0, _val(n.args[2]).dtype)
    return args


def _compound_mask(b, n, m_of):
    """Mask of an op's output with a compound dimension: views carry their input's."""
    if n.target is aten.cat.default:
        # The operands' masks side by side (all True for a static operand).
        parts = []
        for a in n.args[0]:
            ma = m_of(a)
            if ma is _UNKNOWN:
                return _UNKNOWN
            parts.append(ma if ma is not None else b.call(
                aten.ones.default, b.padded(_val(a)), dtype=torch.bool, device=b.device))
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
        return b.call(aten.cat.default, parts, dim)
    if n.target is aten.slice.Tensor:
        return _slice_mask(b, n, m_of)
    if n.target is aten.flip.default:
        # Valid data stays a prefix of a dynamic dimension (_flip); static ones flip.
        m, v = m_of(n.args[0]), _val(n)
        if m is None or m is _UNKNOWN:
            return _UNKNOWN
        static = [d % v.dim() for d in n.args[1] if not isinstance(v.shape[d], torch.SymInt)]
        return b.call(aten.flip.default, m, static) if static else m
    if n.target in (aten.constant_pad_nd.default, aten.slice_backward.default):
        # Its valid data sits at its true indices (_pad_end; zeros around the gradient,
        # itself at its place): a prefix of each dimension.
        if m_of(n.args[0]) is _UNKNOWN or not all(_polynomial(_expr(s)) for s in _val(n).shape):
            return _UNKNOWN
        return b.prefix_mask(_val(n))
    if n.target is aten.index.Tensor:
        # Valid where every index is valid (broadcast), across the static trailing dims.
        shape = b.padded(_val(n))
        m = None
        for i in n.args[1]:
            mi = m_of(i)
            if mi is _UNKNOWN:
                return _UNKNOWN
            if mi is not None:
                m = mi if m is None else b.call(aten.logical_and.default, m, mi)
        if m is None:
            return _UNKNOWN
        nb = max(_val(i).dim() for i in n.args[1])
        m = b.call(aten.view.default, b.call(aten.expand.default, m, shape[:nb]),
                   shape[:nb] + [1] * (len(shape) - nb))
        return b.call(aten.expand.default, m, shape)
    if n.target is aten.embedding.default:
        # One row per index (the weight is static): the indices' mask across the rows.
        m = m_of(n.args[1])
        if m is None or m is _UNKNOWN:
            return _UNKNOWN
        return b.call(aten.expand.default, b.call(aten.unsqueeze.default, m, -1),
                      b.padded(_val(n)))
    target, op_args = (n.args[0], n.args[2:]) if _is_out_dtype(n.target) else (n.target, n.args)
    if target in (aten.mm.default, aten.addmm.default):
        # Rows of the product are the rows of the left operand (K, N static here).
        a = op_args[0] if target is aten.mm.default else op_args[1]
        ma, mb = m_of(a), m_of(op_args[1] if target is aten.mm.default else op_args[2])
        if ma is None or ma is _UNKNOWN or mb is not None or _dyn_dims(_val(a))[-1:] == [1]:
            return _UNKNOWN
        shape = b.padded(_val(n))
        rows = b.call(aten.view.default, b.call(aten.select.int, ma, 1, 0), [shape[0], 1])
        return b.call(aten.expand.default, rows, shape)
    if n.target in _MASKED_OPS or n.target in _STATIC_DIM_OPS:
        # Row-wise over static dimensions: the output's rows are those of an argument of
        # its shape (nll_loss_backward: its `self`).
        for a in n.args:
            ma = m_of(a)
            if ma is not None and ma is not _UNKNOWN and _same_shape(_val(n), _val(a)):
                return ma
        return _UNKNOWN
    if n.target in _SCATTERS:  # shaped like self, whose rows it writes
        m = m_of(n.args[0])
        return _UNKNOWN if m is None else m
    if n.target in _INDEX_SHAPED:
        m = m_of(n.args[_INDEX_SHAPED[n.target]])
        return _UNKNOWN if m is None else m
    if _is_out_dtype(n.target):  # a pointwise op (_OUT_DTYPE_OK) on its arguments
        x, rest = (n.args[2] if len(n.args) > 2 else None), n.args[3:]
        pointwise = True
    else:
        x, rest = (n.args[0] if n.args else None), n.args[1:]
        # (another higher-order op has no tags: its mask is not known)
        pointwise = n.target in _SAME_MASK or n.target in _SCANS or n.target in _POSITIONAL or \
            n.target in _UNTAGGED_POINTWISE or \
            torch.Tag.pointwise in getattr(n.target, "tags", ())
    m = m_of(x)
    if m is None and pointwise and any(isinstance(a, torch.fx.Node) and m_of(a) is not None
                                       for a in rest):
        m = _ALL_VALID  # a static first operand (broadcast): the others' masks tell
    elif m is None and (n.target is aten.expand.default or pointwise) and \
            all(_polynomial(_expr(s)) for s in _val(n).shape):
        # A static tensor broadcast to a dynamic shape: every position holds its value.
        return b.prefix_mask(_val(n))
    if m is None or m is _UNKNOWN:
        return _UNKNOWN
    if n.target in _VIEW_LIKE:
        shape = b.padded(_val(n))
        return b.call(aten.reshape.default if n.target is not aten.expand.default
                      else aten.expand.default, m, shape)
    if n.target in _MOVES:  # the mask moves as the data does
        if any(isinstance(a, torch.fx.Node) for a in rest):
            return _UNKNOWN
        return b.call(n.target, m, *rest)
    if pointwise:
        others = [m_of(a) for a in rest if isinstance(a, torch.fx.Node)]
        for o in others:
            if o is _UNKNOWN:
                return _UNKNOWN
            if o is not None:
                m = o if m is _ALL_VALID else b.call(aten.logical_and.default, m, o)
        return b.call(aten.expand.default, m, b.padded(_val(n)))
    return _UNKNOWN


def _slice_mask(b, n, m_of):
    """A slice's mask: its input's, sliced the same way; along a dynamic dimension also
    below the output's true size (a slice that ends before the input's valid part does,
    x[:s] of a cat of s + 1, leaves valid input data past the output's end)."""
    x, v = _val(n.args[0]), _val(n)
    m = m_of(n.args[0])
    if m is None or m is _UNKNOWN:
        return _UNKNOWN
    dim = n.args[1] % x.dim() if len(n.args) > 1 else 0
    start = n.args[2] if len(n.args) > 2 and n.args[2] is not None else 0
    step = n.args[4] if len(n.args) > 4 else 1
    if not isinstance(start, int) or not isinstance(step, int):
        return _UNKNOWN
    size, length = b.padded(x)[dim], b.padded(v)[dim]
    if start < 0:  # a static dimension here: its padded size is its size
        start += size
    m = b.call(aten.slice.Tensor, m, dim, start, start + step * length, step)
    if isinstance(x.shape[dim], torch.SymInt):
        shape = b.padded(v)
        r = b.call(aten.arange.default, length, dtype=torch.int64, device=b.device)
        c = b.call(aten.lt.Tensor, r, b.size_value(_expr(v.shape[dim])))
        c = b.call(aten.view.default, c, [length if i == dim else 1 for i in range(len(shape))])
        m = b.call(aten.logical_and.default, m, c)
    return m


def _sanitize(b, n, args, m_of):
    """Fills the invalid part of the tensor arguments of a reducing op."""
    op = n.target
    need = op in _MASKED_OPS or op is aten.native_layer_norm_backward.default
    if not need:
        return args
    if op in (aten._softmax.default, aten._log_softmax.default):
        x = _val(n.args[0])
        if (n.args[1] % x.dim()) in _dyn_dims(x):
            args[0] = _filled(b, n, 0, args[0], m_of(n.args[0]), float("-inf"))
        return args
    fill_target = op in (aten.nll_loss_forward.default, aten.nll_loss_backward.default)
    for i, a in enumerate(n.args):
        if not isinstance(a, torch.fx.Node) or not isinstance(_val(a), torch.Tensor):
            continue
        if fill_target and i == (1 if op is aten.nll_loss_forward.default else 2):
            ignore = n.args[4] if op is aten.nll_loss_forward.default else n.args[5]
            args[i] = _filled(b, n, i, args[i], m_of(a), ignore)
        else:
            args[i] = _filled(b, n, i, args[i], m_of(a), _SANITIZE_FILL.get(op, 0))
    if op in _ATTENTION:
        _mask_padded_keys(b, n, args, m_of)
    return args


# Attention ops: positions of (query, key, bias, is_causal) among their arguments.
_ATTENTION = {aten._scaled_dot_product_fused_attention_overrideable.default: (0, 1, 3, 5),
              aten._scaled_dot_product_fused_attention_overrideable_backward.default: (1, 2, 4, 13)}


def _mask_padded_keys(b, n, args, m_of):
    """Padded keys get no attention: the bias is -inf where a key is padding. (A causal
    mask already keeps every valid query off them: they come after it.)"""
    qi, ki, bi, ci = _ATTENTION[n.target]
    causal = n.args[ci] if len(n.args) > ci else n.kwargs.get("is_causal", False)
    key_mask = m_of(n.args[ki])
    if causal or key_mask is None:
        return
    if key_mask is _UNKNOWN:
        _refuse(n.target, "attends over keys whose valid part cannot be told")
    dtype = _val(n.args[qi]).dtype
    key_valid = b.call(aten.unsqueeze.default, b.call(aten.select.int, key_mask, -1, 0), -2)
    neg = b.call(aten.scalar_tensor.default, float("-inf"), dtype=dtype, device=b.device)
    bias = args[bi] if len(args) > bi and args[bi] is not None else \
        b.call(aten.scalar_tensor.default, 0.0, dtype=dtype, device=b.device)
    bias = b.call(aten.where.self, key_valid, bias, neg)
    q, k = b.padded(_val(n.args[qi])), b.padded(_val(n.args[ki]))
    bias = b.call(aten.expand.default, bias, list(k[:-2]) + [q[-2], k[-2]])
    while len(args) <= bi:
        args.append(None)
    args[bi] = bias


def _filled(b, n, i, x, m, value):
    r = _fill(b, x, m, value, _val(n.args[i]).dtype)
    if r is _UNKNOWN:
        raise NotImplementedError(
            f"torch_tpu bounded dynamism: argument {i} of {n.target} has a dynamic dimension "
            f"whose valid part cannot be told ({_val(n.args[i]).shape})")
    return r


def user_outputs(gm):
    """How many of a forward graph's outputs reach the user (the rest are saved for the
    backward); None when all do (inference and backward graphs)."""
    if any(n.op == "placeholder" and n.name.startswith("tangents") for n in gm.graph.nodes):
        return None
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    return getattr(meta, "num_forward", None)


class BoundedGraph:
    """Pads inputs to the bound, runs the one program, views outputs at their true sizes."""

    def __init__(self, gm: torch.fx.GraphModule, make_compiled, n_user_outputs=None):
        self._boxed_call = True  # an instance attribute (see _CompiledGraph)
        check_graph(gm)
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        vals = [_val(p) for p in phs]
        syms = set().union(*[_symbols_of(v) for v in vals])
        env = next(s.node.shape_env for v in vals for s in
                   ([v] if isinstance(v, torch.SymInt) else list(getattr(v, "shape", [])))
                   if isinstance(s, torch.SymInt))
        self._ranges = {s: (int(env.var_to_range[s].lower), int(env.var_to_range[s].upper))
                        for s in syms}
        self._bounds = {s: sympy.Integer(hi) for s, (_, hi) in self._ranges.items()}
        self._syms = sorted(syms, key=str)
        # (an input at a size symbol + c, the gradient of x[:, 2:], is a prefix: its mask
        # follows from its shape as a bare symbol's does)
        mask_inputs = [p for p, v in zip(phs, vals) if _dyn_dims(v) and not _structural(v)
                       and not _prefix_shape(v)]
        self._ins = []
        for v in vals:
            if isinstance(v, torch.SymInt):
                self._ins.append(("sym", _expr(v), None))
            elif _dyn_dims(v):
                self._ins.append(("tensor", [_expr(s) for s in v.shape],
                                  [_eval(_expr(s), self._bounds) for s in v.shape]))
            else:
                self._ins.append(("plain", None, None))
        self._mask_in = [phs.index(p) for p in mask_inputs]
        dev = next((v.device for v in vals if isinstance(v, torch.Tensor)), torch.device("tpu"))
        b = _Builder(self._bounds, dev)
        outs, out_masks = _rewrite(gm, b, set(mask_inputs))
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        self._outs = []
        extra = []
        n_user = len(outs) if n_user_outputs is None else n_user_outputs
        for i, (o, m) in enumerate(zip(out_node.args[0], out_masks)):
            v = _val(o)
            if isinstance(v, torch.SymInt):
                self._outs.append(("sym", _expr(v)))
            elif isinstance(v, torch.Tensor) and _dyn_dims(v):
                exprs = [_expr(s) for s in v.shape]
                if _structural(v) or (i < n_user and _prefix_shape(v)):
                    # (A size symbol + c, x[:, 2:], holds its valid part as a prefix too:
                    # every op that moves data along a dynamic dimension keeps it so.)
                    # A user's output gets the strides eager's op gives (a prefix view
                    # of the padded buffer is strided across a dynamic inner dimension);
                    # one saved for the backward stays a view (found padded again there).
                    strides = [_expr(st) for st in v.stride()] if i < n_user else None
                    self._outs.append(("tensor", (exprs, strides)))
                elif i >= n_user and m is not _UNKNOWN and m is not None:
                    # Saved for the backward: stays padded, its mask travels beside it.
                    self._outs.append(("masked", len(extra)))
                    extra.append(m)
                else:
                    raise NotImplementedError(
                        f"torch_tpu bounded dynamism: output {i} has the compound dynamic shape "
                        f"{tuple(v.shape)}; return tensors whose dynamic dimensions are each one "
                        "marked dimension")
            elif isinstance(v, torch.Tensor) and isinstance(v.storage_offset(), torch.SymInt) and \
                    _aliased(v, vals) is not None:
                # A view of an input at an offset that is a size (table[n - 1]): AOTAutograd
                # makes it again from the input with our output's offset, so the output is
                # that view itself, at the true offset.
                self._outs.append(("alias", (_aliased(v, vals), _expr(v.storage_offset()))))
            else:
                self._outs.append(("plain", None))
        b.g.output(tuple(outs) + tuple(extra))
        self._n_out = len(outs)
        self._inner = make_compiled(torch.fx.GraphModule(gm, b.g))

    def _symbols(self, args):
        """The true value of each symbol, from SymInt inputs, else from unpadded tensors."""
        values = {}
        for (kind, e, _), a in zip(self._ins, args):
            if kind == "sym" and isinstance(e, sympy.Symbol):
                values[e] = int(a)
        for (kind, exprs, padded), a in zip(self._ins, args):
            if kind != "tensor" or _padded_base(a, padded) is not None:
                continue
            for e, s in zip(exprs, a.shape):
                if isinstance(e, sympy.Symbol) and e not in values:
                    values[e] = int(s)
                elif isinstance(e, sympy.Add) and len(e.free_symbols) == 1:
                    sym = next(iter(e.free_symbols))  # symbol + c (_prefix_shape)
                    if (e - sym).is_Integer and sym not in values:
                        values[sym] = int(s) - int(e - sym)
        for s, (lo, hi) in self._ranges.items():
            if s not in values:
                raise RuntimeError(f"torch_tpu bounded dynamism: cannot tell the size {s} from "
                                   "the graph's inputs")
            if not lo <= values[s] <= hi:
                raise ValueError(f"torch_tpu bounded dynamism: size {values[s]} is outside the "
                                 f"bounds [{lo}, {hi}] the program was compiled for "
                                 "(torch_tpu.dynamism.mark_dynamic)")
        return {s: sympy.Integer(v) for s, v in values.items()}

    def __call__(self, args):
        from .bounded_eager import suspended
        with suspended():  # eager DeferAndFuse's padding is not this graph's
            return self._call(args)

    def _call(self, args):
        values = self._symbols(args)
        dev = next((a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "tpu"),
                   torch.device("tpu"))
        new_args, in_masks = [], []
        with _strict():  # padding is per size: its own small programs, not the graph's
            for (kind, e, padded), a in zip(self._ins, args):
                if kind == "sym":
                    new_args.append(_eval(e, self._bounds))
                elif kind == "tensor":
                    new_args.append(_pad(a, padded))
                else:
                    new_args.append(a)
        for i in self._mask_in:
            hit = _lookup(new_args[i], new_args[i].shape)
            m = hit[1] if hit is not None else None
            if m is None:
                raise NotImplementedError(
                    f"torch_tpu bounded dynamism: input {i} has the compound dynamic shape "
                    f"{tuple(args[i].shape)} and did not come from a bounded program")
            in_masks.append(m)
        for s in self._syms:
            new_args.append(torch.tensor(int(values[s]), dtype=torch.int64).to(dev))
        new_args += in_masks
        given = list(args)
        args.clear()
        outs = list(self._inner(new_args))
        extra = outs[self._n_out:]
        res = []
        for (kind, info), o in zip(self._outs, outs):
            if kind == "sym":
                res.append(_eval(info, values))
            elif kind == "tensor":
                _keep(o)
                exprs, strides = info
                for d, e in enumerate(exprs):
                    if e.free_symbols:
                        o = o.narrow(d, 0, _eval(e, values))
                if strides is not None:
                    o = _restrided(o, [_eval(st, values) for st in strides])
                res.append(o)
            elif kind == "masked":
                _keep(o, extra[info])
                res.append(o)
            elif kind == "alias":
                res.append(given[info[0]].as_strided(o.shape, o.stride(), _eval(info[1], values)))
            else:
                res.append(o)
        return res


def _prefix_shape(v) -> bool:
    """Whether each dynamic size of `v` is one symbol plus a constant (x[:, 2:]: s - 2)."""
    def prefix(e):
        if isinstance(e, sympy.Symbol) or not e.free_symbols:
            return True
        return isinstance(e, sympy.Add) and len(e.free_symbols) == 1 and \
            (e - next(iter(e.free_symbols))).is_Integer
    return all(prefix(_expr(s)) if isinstance(s, torch.SymInt) else True for s in v.shape)


def _aliased(v, vals):
    """The index of the static input whose storage the fake output `v` views, or None."""
    for i, a in enumerate(vals):
        if isinstance(a, torch.Tensor) and not _dyn_dims(a) and \
                a.untyped_storage()._cdata == v.untyped_storage()._cdata:
            return i
    return None


def _restrided(o, strides):
    """`o` (a prefix view of a padded output) with the given strides: itself when its
    layout already is that (dimensions of size 1 aside), else a copy laid out so."""
    if all(n <= 1 or a == b for n, a, b in zip(o.shape, o.stride(), strides)):
        return o
    broadcast = [d for d, (n, st) in enumerate(zip(o.shape, strides)) if st == 0 and n > 1]
    if broadcast:
        # An expanded output (sum's gradient): copying into stride 0 would write one
        # element many times; its one row is laid out, then expanded again.
        row = o
        for d in broadcast:
            row = row.narrow(d, 0, 1)
        return _restrided(row, strides).expand(o.shape)
    with _strict():  # per size: a small program of its own, like the padding
        if list(strides) == _contiguous_strides(o.shape):
            return o.contiguous()
        out = torch.empty_strided(o.shape, strides, dtype=o.dtype, device=o.device)
        out.copy_(o)
        return out


def _contiguous_strides(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return out[::-1]


# Padded outputs of bounded programs (and the masks of those saved for the backward),
# by storage and layout: autograd hands the backward other tensor objects, and the
# caller sees a prefix view. An entry lives while its storage does.
_PADDED = {}


def _padded_key(t, shape):
    return (t.untyped_storage()._cdata, t.storage_offset(), tuple(t.stride()), tuple(shape))


def _keep(t, mask=None):
    from torch.multiprocessing.reductions import StorageWeakRef
    for k in [k for k, (ref, _) in _PADDED.items() if ref.expired()]:
        del _PADDED[k]
    _PADDED[_padded_key(t, t.shape)] = (StorageWeakRef(t.untyped_storage()), mask)


def _lookup(t, shape):
    hit = _PADDED.get(_padded_key(t, shape))
    return None if hit is None or hit[0].expired() else hit


@contextlib.contextmanager
def _strict():
    from .. import _C
    from .execution_mode import EagerMode
    if _C.get_eager_mode() != EagerMode.DEFER_AND_FUSE.value:
        yield
        return
    _C.flush("before bounded padding")
    # Launched at once (Strict would queue a program not loaded yet behind its compile):
    # the padded values are buffers before the next graph records them. (This thread
    # only: other threads keep the process's mode.)
    saved = _C._set_thread_eager_mode(EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING.value)
    try:
        yield
    finally:
        _C._set_thread_eager_mode(saved)


def _padded_base(t, padded):
    """`t` itself when it has the padded shape, or the padded output of a bounded
    program whose prefix view `t` is; None otherwise."""
    if list(t.shape) == list(padded):
        return t
    if _lookup(t, padded) is not None:
        return t.as_strided(padded, t.stride(), t.storage_offset())
    return None


def _pad(t, padded):
    base = _padded_base(t, padded)
    if base is not None:
        return base
    pads = []
    for s, p in zip(reversed(t.shape), reversed(padded)):
        pads += [0, p - s]
    return torch.nn.functional.pad(t, pads)
