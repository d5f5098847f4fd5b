"""Bounded dynamic shapes in compiled mode: one program for every size up to the bound.

XLA's bounded dynamism does the work. A graph with dynamic sizes (bounded by
`mark_dynamic`) is replayed once with every dynamic dimension padded to its bound and
the symbols bound to their upper bounds, so the recorded program has static types and
its text is the same for every size. Around the graph's body, two tiny imported
StableHLO modules (torch_tpu::call_stablehlo) carry the true sizes:
- each padded input goes through `stablehlo.set_dimension_size` with its true size,
  an i32 program operand, so XLA knows that only a prefix of the dimension is valid:
  its dynamic padder then masks reductions, dot contractions and softmax across it and
  compacts merged dimensions in reshapes;
- each output with a dynamic dimension goes through `set_dimension_size` to its bound
  (a constant), which turns it back into a static buffer whose valid part is a prefix
  of every dynamic dimension; the caller sees a view of that prefix.
Tensors passed between the forward and the backward stay padded (the view's base).

What XLA cannot fix is a size baked into a lowering as a constant (mean's divisor, a
size used as a scalar). So each op that touches a dynamic dimension must be one of a
listed set (checked when the graph is lowered); any other raises NotImplementedError
naming the op rather than computing silently wrong values.
"""
import operator

import sympy
import torch

_i32 = torch.int32
_ELEM = {
    torch.bool: "i1", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32",
    torch.int64: "i64", torch.uint8: "ui8", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.float32: "f32", torch.float64: "f64",
}
aten = torch.ops.aten

# -- which ops may touch a dynamic dimension ------------------------------------------------

# Shape-only ops: they move data, XLA follows the dynamic sizes through them.
_SHAPE_OPS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.t.default,
    aten.transpose.int, aten.permute.default, aten.unsqueeze.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.squeeze.default, aten.expand.default, aten.clone.default,
    aten.detach.default, aten.alias.default, aten._to_copy.default, aten.arange.default,
    aten.arange.start, aten.arange.start_step, aten.contiguous.default,
}
# Ops whose reductions/contractions XLA's dynamic padder masks (checked against the
# static program in tests/test_dynamism.py), and row-wise ops over static dimensions.
_MASKED_OPS = {
    aten.sum.dim_IntList, aten.amax.default, aten.amin.default,
    aten._softmax.default, aten._log_softmax.default, aten._softmax_backward_data.default,
    aten._log_softmax_backward_data.default, aten.mm.default, aten.bmm.default,
    aten.addmm.default, aten.embedding.default, aten.embedding_dense_backward.default,
    aten.nll_loss_forward.default, aten.nll_loss_backward.default,
    aten._scaled_dot_product_fused_attention_overrideable.default,
    aten._scaled_dot_product_fused_attention_overrideable_backward.default,
}
# Ops fine while they act on static dimensions only (their argument names them).
_STATIC_DIM_OPS = {
    aten.native_layer_norm.default: "normalized", aten.native_layer_norm_backward.default: "normalized",
    aten.mean.dim: "dims", aten.cat.default: "dim", aten.split.Tensor: "dim",
    aten.split_with_sizes.default: "dim", aten.select.int: "dim", aten.slice.Tensor: "dim",
}
SUPPORTED = sorted(str(o) for o in _SHAPE_OPS | _MASKED_OPS | set(_STATIC_DIM_OPS)) + ["pointwise ops"]


def _val(n):
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else n


def _dyn_dims(v):
    """Indices of the symbolic dimensions of a fake tensor (or [] for anything else)."""
    if not isinstance(v, torch.Tensor):
        return []
    return [i for i, s in enumerate(v.shape) if isinstance(s, torch.SymInt)]


def _has_symint(a):
    if isinstance(a, (list, tuple)):
        return any(_has_symint(x) for x in a)
    v = _val(a)
    return isinstance(v, torch.SymInt) and not isinstance(a, int)


def _static_dims_ok(node, kind) -> bool:
    """Whether `node` (an op of _STATIC_DIM_OPS) acts only on static dimensions."""
    x = _val(node.args[0][0] if kind == "dim" and node.target is aten.cat.default else node.args[0])
    dyn = set(_dyn_dims(x))
    if kind == "normalized":
        k = len(node.args[1] if node.target is aten.native_layer_norm.default else node.args[2])
        dims = range(x.dim() - k, x.dim())
    elif kind == "dims":
        d = node.args[1] if len(node.args) > 1 else None
        dims = range(x.dim()) if d is None else d
    else:
        dim = node.args[1 if node.target is not aten.slice.Tensor else 1] if len(node.args) > 1 else 0
        if node.target is aten.cat.default:
            dim = node.args[1] if len(node.args) > 1 else 0
        if node.target is aten.slice.Tensor and (dim % x.dim()) in dyn:
            # A slice that keeps the whole dimension is fine.
            start = node.args[2] if len(node.args) > 2 else 0
            end = node.args[3] if len(node.args) > 3 else None
            full = _val(end) is None or (isinstance(_val(end), int) and _val(end) >= 2 ** 62) \
                or _val(end) == x.shape[dim % x.dim()]
            return start == 0 and full
        dims = [dim]
    return not any((d % x.dim()) in dyn for d in dims)


def check_graph(gm: torch.fx.GraphModule) -> None:
    """Raises NotImplementedError naming the first op that touches a dynamic dimension
    and is not known to be computed right under bounded dynamism."""
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        if not isinstance(n.target, torch._ops.OpOverload):
            continue  # SymInt arithmetic (operator.mul, sym_size) on the bounds
        ins = [a for a in n.all_input_nodes]
        touches = any(_dyn_dims(_val(a)) for a in ins) or any(
            _dyn_dims(v) for v in (_val(n) if isinstance(_val(n), (list, tuple)) else [_val(n)]))
        uses_size = any(isinstance(_val(a), torch.SymInt) for a in ins)
        if not touches and not uses_size:
            continue
        op = n.target
        if op in _SHAPE_OPS or op in _MASKED_OPS:
            if uses_size and op not in _SHAPE_OPS:
                _refuse(op, "takes a dynamic size as an argument")
            continue
        if op in _STATIC_DIM_OPS:
            if _static_dims_ok(n, _STATIC_DIM_OPS[op]):
                continue
            _refuse(op, "acts on a dynamic dimension")
        if torch.Tag.pointwise in op.tags:
            if uses_size:
                _refuse(op, "uses a dynamic size as a value")
            continue
        _refuse(op, "is not in the list of ops supported across a dynamic dimension")


def _refuse(op, why):
    raise NotImplementedError(
        f"torch_tpu bounded dynamism: {op} {why}; one program for every size cannot be built "
        f"for it. Supported across dynamic dimensions: pointwise ops, shape ops, sum/amax/amin, "
        f"softmax, mm/bmm/addmm, embedding, nll_loss, scaled_dot_product_attention; layer_norm, "
        f"mean, cat, split, select over static dimensions. Mark fewer dimensions dynamic or "
        f"compile with dynamic=False.")


# -- the imported modules ---------------------------------------------------------------------

def _ttype(shape, elem, dyn=()):
    dims = "x".join("?" if i in dyn else str(s) for i, s in enumerate(shape))
    body = f"{dims}x{elem}" if shape else elem
    if not dyn:
        return f"tensor<{body}>"
    bounds = ", ".join(str(s) if i in dyn else "?" for i, s in enumerate(shape))
    return f"tensor<{body}, #stablehlo.bounds<{bounds}>>"


def _module(params, lines, result):
    sig = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(params))
    body = "\n".join("    " + ln for ln in lines)
    return ('"builtin.module"() ({\n'
            f'  "func.func"() <{{function_type = ({", ".join(params)}) -> {result}, sym_name = "main"}}> ({{\n'
            f'  ^bb0({sig}):\n{body}\n'
            f'    "func.return"(%r) : ({result}) -> ()\n'
            '  }) : () -> ()\n'
            '}) : () -> ()\n')


_modules = {}  # (kind, shape, dtype, dims) -> module id


def _set_sizes_module(shape, dtype, dims):
    """main(x, n_0, ..., n_k) = x whose dimensions `dims` hold n_i valid elements."""
    key = ("set", tuple(shape), dtype, tuple(dims))
    if key not in _modules:
        from .. import _C
        elem = _ELEM[dtype]
        static = _ttype(shape, elem)
        lines, prev, done = [], "%arg0", []
        for j, d in enumerate(dims):
            done.append(d)
            t_in = _ttype(shape, elem, done[:-1])
            t_out = _ttype(shape, elem, done)
            lines.append(f'%s{j} = "stablehlo.set_dimension_size"({prev}, %arg{j + 1}) '
                         f'<{{dimension = {d} : i64}}> : ({t_in}, tensor<i32>) -> {t_out}')
            prev = f"%s{j}"
        lines.append(f'%r = "stablehlo.convert"({prev}) : ({_ttype(shape, elem, done)}) -> {static}')
        text = _module([static] + ["tensor<i32>"] * len(dims), lines, static)
        spec = (elem, list(shape))
        _modules[key] = _C._import_stablehlo(text, "torch_tpu::bounded_input", [spec] + [("i32", [])] * len(dims),
                                             [spec])
    return _modules[key]


def _static_module(shape, dtype, dims):
    """main(x) = x with dimensions `dims` static again (valid part: a prefix of each)."""
    key = ("static", tuple(shape), dtype, tuple(dims))
    if key not in _modules:
        from .. import _C
        elem = _ELEM[dtype]
        static = _ttype(shape, elem)
        lines, prev = [], "%arg0"
        for j, d in enumerate(dims):
            lines.append(f'%c{j} = "stablehlo.constant"() <{{value = dense<{shape[d]}> : tensor<i32>}}> : '
                         f'() -> tensor<i32>')
            lines.append(f'%s{j} = "stablehlo.set_dimension_size"({prev}, %c{j}) '
                         f'<{{dimension = {d} : i64}}> : ({static}, tensor<i32>) -> {static}')
            prev = f"%s{j}"
        lines.append(f'%r = "stablehlo.convert"({prev}) : ({static}) -> {static}')
        spec = (elem, list(shape))
        _modules[key] = _C._import_stablehlo(_module([static], lines, static), "torch_tpu::bounded_output",
                                             [spec], [spec])
    return _modules[key]


# -- the graph around the body ----------------------------------------------------------------

def _expr(s):
    return s.node.expr if isinstance(s, torch.SymInt) else sympy.Integer(int(s))


def _eval(e, values) -> int:
    return int(e.xreplace(values))


class BoundedGraph:
    """Pads inputs to the bound, runs the one program, views outputs at their true sizes."""

    def __init__(self, gm: torch.fx.GraphModule, make_compiled):
        self._boxed_call = True  # an instance attribute (see _CompiledGraph)
        check_graph(gm)
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        vals = [_val(p) for p in phs]
        env = next((s.node.shape_env for v in vals for s in
                    ([v] if isinstance(v, torch.SymInt) else list(getattr(v, "shape", [])))
                    if isinstance(s, torch.SymInt)), None)
        syms = set()
        for v in vals:
            for s in ([v] if isinstance(v, torch.SymInt) else list(getattr(v, "shape", []))):
                if isinstance(s, torch.SymInt):
                    syms |= s.node.expr.free_symbols
        self._ranges = {s: (int(env.var_to_range[s].lower), int(env.var_to_range[s].upper)) for s in syms}
        self._bounds = {s: sympy.Integer(hi) for s, (_, hi) in self._ranges.items()}
        # Inputs: per placeholder its kind and symbolic sizes.
        self._ins = []
        size_exprs = []  # distinct true sizes the program takes as operands
        g = torch.fx.Graph()
        val_map, new_ph = {}, {}
        for p, v in zip(phs, vals):
            new = g.placeholder(p.name)
            new.meta = dict(p.meta)
            val_map[p] = new_ph[p] = new
        size_nodes = {}
        for p, v in zip(phs, vals):
            if isinstance(v, torch.SymInt):
                self._ins.append(("sym", _expr(v), None))
                continue
            dims = _dyn_dims(v)
            if not dims:
                self._ins.append(("plain", None, None))
                continue
            exprs = [_expr(s) for s in v.shape]
            padded = [_eval(e, self._bounds) for e in exprs]
            self._ins.append(("tensor", exprs, padded))
            args = [val_map[p]]
            for d in dims:
                e = exprs[d]
                if e not in size_nodes:
                    size_nodes[e] = None
                    size_exprs.append(e)
            mid = _set_sizes_module(padded, v.dtype, dims)
            val_map[p] = ("set", p, dims, mid)  # built once the size placeholders exist
        for i, e in enumerate(size_exprs):
            size_nodes[e] = g.placeholder(f"_tpu_size_{i}")
        for p in phs:
            c = val_map[p]
            if isinstance(c, tuple):
                _, _, dims, mid = c
                exprs = self._ins[phs.index(p)][1]
                node = g.call_function(torch.ops.torch_tpu.call_stablehlo.default,
                                       ([new_ph[p]] + [size_nodes[exprs[d]] for d in dims], mid))
                val_map[p] = g.call_function(operator.getitem, (node, 0))
        outs = g.graph_copy(gm.graph, val_map)
        # Outputs.
        self._outs = []
        new_outs = []
        for o, r in zip(out_node.args[0], outs if isinstance(outs, (list, tuple)) else [outs]):
            v = _val(o)
            if isinstance(v, torch.SymInt):
                self._outs.append(("sym", _expr(v)))
                new_outs.append(r)
                continue
            dims = _dyn_dims(v)
            if not dims:
                self._outs.append(("plain", None))
                new_outs.append(r)
                continue
            exprs = [_expr(s) for s in v.shape]
            padded = [_eval(e, self._bounds) for e in exprs]
            node = g.call_function(torch.ops.torch_tpu.call_stablehlo.default,
                                   ([r], _static_module(padded, v.dtype, dims)))
            new_outs.append(g.call_function(operator.getitem, (node, 0)))
            self._outs.append(("tensor", (exprs, dims)))
        g.output(tuple(new_outs) if isinstance(out_node.args[0], (list, tuple)) else new_outs[0])
        self._size_exprs = size_exprs
        self._nph = len(phs)
        self._inner = make_compiled(torch.fx.GraphModule(gm, g))

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
        for s, (lo, hi) in self._ranges.items():
            if s not in values:
                raise RuntimeError(f"torch_tpu bounded dynamism: cannot tell the size {s} from the "
                                   "graph's inputs")
            if not lo <= values[s] <= hi:
                raise ValueError(f"torch_tpu bounded dynamism: size {values[s]} is outside the "
                                 f"bounds [{lo}, {hi}] the program was compiled for "
                                 "(torch_tpu.dynamism.mark_dynamic)")
        return {s: sympy.Integer(v) for s, v in values.items()}

    def __call__(self, args):
        values = self._symbols(args)
        new_args = []
        for (kind, e, padded), a in zip(self._ins, args):
            if kind == "sym":
                new_args.append(_eval(e, self._bounds))
            elif kind == "tensor":
                new_args.append(_pad(a, padded))
            else:
                new_args.append(a)
        for e in self._size_exprs:
            new_args.append(torch.tensor(_eval(e, values), dtype=_i32).to(args_device(args)))
        args.clear()
        outs = self._inner(new_args)
        single = not isinstance(outs, (list, tuple))
        outs = [outs] if single else list(outs)
        res = []
        for (kind, info), o in zip(self._outs, outs):
            if kind == "sym":
                res.append(_eval(info, values))
            elif kind == "tensor":
                exprs, dims = info
                v = o
                for d in dims:
                    v = v.narrow(d, 0, _eval(exprs[d], values))
                res.append(v)
            else:
                res.append(o)
        return res[0] if single else res


def args_device(args):
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "tpu":
            return a.device
    return torch.device("tpu")


def _padded_base(t, padded):
    """The padded tensor `t` is a prefix view of (an output of a bounded program), or t
    itself when it already has the padded shape; None otherwise."""
    if list(t.shape) == list(padded):
        return t
    b = t._base
    if b is not None and list(b.shape) == list(padded) and b.stride() == t.stride() \
            and b.storage_offset() == t.storage_offset():
        return b
    return None


def _pad(t, padded):
    b = _padded_base(t, padded)
    if b is not None:
        return b
    pads = []
    for s, p in zip(reversed(t.shape), reversed(padded)):
        pads += [0, p - s]
    return torch.nn.functional.pad(t, pads)
