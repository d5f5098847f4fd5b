"""Which ATen ops may touch a dynamic dimension of a bounded graph (bounded.py).

Shape ops, pointwise ops and the listed reducing ops are computed right on inputs padded
to the bound (the reducing ones after bounded.py masks their inputs); any other op that
touches a dynamic dimension is refused by name rather than computed silently wrong.
"""
import operator

import sympy
import torch

aten = torch.ops.aten

# Shape-only ops: they move data; masks move with it.
_SHAPE_OPS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.t.default,
    aten.transpose.int, aten.permute.default, aten.unsqueeze.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.squeeze.default, aten.expand.default, aten.clone.default,
    aten.detach.default, aten.alias.default, aten._to_copy.default, aten.arange.default,
    aten.arange.start, aten.arange.start_step, aten.contiguous.default,
    # Factories (constant everywhere) and sizes (read at the bound, like every shape).
    aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format,
    aten.new_zeros.default, aten.new_ones.default, aten.new_full.default,
    aten.new_empty.default, aten.sym_size.int, aten.sym_numel.default,
    aten.zeros_like.default, aten.ones_like.default, aten.full_like.default, aten.empty_like.default,
    aten.fill.Scalar,
}
# Ops that reduce or contract across a dynamic dimension (inputs masked first), checked
# against float64 references in tests/test_dynamism.py.
_MASKED_OPS = {
    aten.sum.dim_IntList, aten.sum.default, aten.amax.default, aten.amin.default,
    aten._softmax.default, aten._log_softmax.default, aten._softmax_backward_data.default,
    aten._log_softmax_backward_data.default, aten.mm.default, aten.bmm.default,
    aten.addmm.default, aten.embedding.default, aten.embedding_dense_backward.default,
    aten.nll_loss_forward.default, aten.nll_loss_backward.default,
    aten._scaled_dot_product_fused_attention_overrideable.default,
    aten._scaled_dot_product_fused_attention_overrideable_backward.default,
    # any/all: the padding filled with False/True (bounded._SANITIZE_FILL)
    aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims,
}
# Scans: output element i along `dim` reads input elements 0..i only, so a valid element
# reads valid data only (the padding comes after it); across other dimensions they are
# row-wise. Right on padded inputs with no mask.
_SCANS = {aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default,
          aten.cummax.default, aten.cummin.default}
# flip along a dynamic dimension is rewritten (bounded._flip): element i is element
# size-1-i, gathered with the true size, so that the padding stays at the end.
_REWRITTEN = {aten.flip.default}
# Their SymInt arguments are sizes (max_q, max_k), not values: the bounds are right.
_SIZE_ARGS_OK = {aten._scaled_dot_product_fused_attention_overrideable_backward.default}
# Ops whose output is shaped like an index argument (its position) and reads the data at
# the index's values: its valid part is the index's, and valid indices read valid data.
_INDEX_SHAPED = {aten.gather.default: 2}
# tril/triu: output element (i, j) is input element (i, j) or 0, by j - i against a static
# diagonal; the padded tensor holds the valid part at the same indices, so its valid part
# comes out as the true op's (a causal mask built from the dynamic length).
_POSITIONAL = {aten.tril.default, aten.triu.default}
# Scatters along a static dimension (max/sort/topk's backward scatters the gradient into
# zeros along the reduced one): row-wise in the others, where the index's dynamic sizes
# are self's, so each valid index row writes a valid row (padded index positions are set
# to 0 in the rewrite, bounded._scatter_args: they write into padding rows).
_SCATTERS = {aten.scatter.src, aten.scatter.value, aten.scatter_add.default,
             aten.scatter.reduce, aten.scatter.value_reduce}


def _scatter_ok(n) -> bool:
    """A scatter whose `dim` is static in self and the index, and whose index's dynamic
    dimensions are self's (the same size) in the same place."""
    x, idx = _val(n.args[0]), _val(n.args[2])
    d = n.args[1] % max(x.dim(), 1)
    if x.dim() == 0 or isinstance(x.shape[d], torch.SymInt) or isinstance(idx.shape[d], torch.SymInt):
        return False
    return all(not isinstance(i, torch.SymInt) or str(_expr(i)) == str(_expr(s))
               for i, s in zip(idx.shape, x.shape))


# In-place elementwise ops without PyTorch's pointwise tag (the norm's backward fills
# where the norm is 0): on a padded value, as their out-of-place forms.
_UNTAGGED_POINTWISE = {aten.masked_fill_.Scalar, aten.masked_fill_.Tensor}

# Ops fine while they act on static dimensions only (their argument names them).
_STATIC_DIM_OPS = {
    aten.native_layer_norm.default: "normalized", aten.native_layer_norm_backward.default: "normalized",
    aten.cat.default: "dim", aten.split.Tensor: "dim",
    aten.split_with_sizes.default: "dim", aten.select.int: "dim", aten.slice.Tensor: "dim",
}

# Reductions, sorts and selections along their `dim` argument only (None: every
# dimension): row-wise with respect to the other dimensions, so right along static ones
# (greedy decoding's logits.argmax(-1) of a dynamic sequence); refused along a dynamic one.
_ALONG_DIM = {
    aten.argmax.default, aten.argmin.default, aten.max.dim, aten.min.dim,
    aten.sort.default, aten.sort.stable, aten.topk.default, aten.kthvalue.default,
    aten.median.dim, aten.nanmedian.dim, aten.mode.default,
    aten.var.correction, aten.std.correction, aten.var_mean.correction,
    aten.std_mean.correction, aten.var.dim, aten.std.dim, aten.logsumexp.default,
    aten.linalg_vector_norm.default, aten.norm.ScalarOpt_dim, aten.prod.dim_int,
    aten.nansum.default, aten.aminmax.default,
}


def _along_static_dims(n) -> bool:
    """Whether `n` (an op of _ALONG_DIM) acts along static dimensions only."""
    x = _val(n.args[0])
    schema = n.target._schema.arguments
    i = next(k for k, a in enumerate(schema) if a.name == "dim")
    dims = n.args[i] if i < len(n.args) and not schema[i].kwarg_only else \
        n.kwargs.get("dim", schema[i].default_value if schema[i].has_default_value() else None)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = range(x.dim())  # every dimension
    elif isinstance(dims, int):
        dims = [dims]
    dyn = set(_dyn_dims(x))
    return x.dim() == 0 or not any(d % x.dim() in dyn for d in dims)


# Ops that fill a tensor with a Scalar: a size as that value is filled in after the op
# (bounded._rewrite: fill.Tensor with the true size).
_FILLS = {aten.full.default, aten.new_full.default, aten.full_like.default, aten.fill.Scalar}
_ARANGES = {aten.arange.default, aten.arange.start, aten.arange.start_step}


def _value_args(n):
    """{argument position or name: SymInt} of the sizes `n` takes as values (a Scalar or
    Tensor argument), as opposed to sizes (int[]) and positions (int: an index, a start)."""
    out = {}
    schema = n.target._schema.arguments
    for i, a in enumerate(schema):
        v = n.args[i] if i < len(n.args) else n.kwargs.get(a.name)
        if isinstance(v, torch.fx.Node) and isinstance(_val(v), torch.SymInt) and \
                "int" not in str(a.type):
            out[i if i < len(n.args) else a.name] = _val(v)
    return out


def _arange_length_only(n) -> bool:
    """arange whose sizes are its end only (start and step static): element i is
    start + i*step at every size; the end sets the length, read at the bound like every
    length (the valid part its prefix)."""
    vals = _value_args(n)
    return all(k in (0, "end") if n.target is aten.arange.default else k in (1, "end")
               for k in vals)


def _same_shape(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and \
        [str(s) for s in a.shape] == [str(s) for s in b.shape]


def _val(n):
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else n


def _dyn_dims(v):
    """Indices of the symbolic dimensions of a fake tensor (or [] for anything else)."""
    if not isinstance(v, torch.Tensor):
        return []
    return [i for i, s in enumerate(v.shape) if isinstance(s, torch.SymInt)]


def _static_dims_ok(node, kind) -> bool:
    """Whether `node` (an op of _STATIC_DIM_OPS) acts only on static dimensions."""
    x = _val(node.args[0][0] if kind == "dim" and node.target is aten.cat.default else node.args[0])
    dyn = set(_dyn_dims(x))
    if kind == "normalized":
        k = len(node.args[1] if node.target is aten.native_layer_norm.default else node.args[2])
        dims = range(x.dim() - k, x.dim())
    else:
        pos = 2 if node.target in (aten.split.Tensor, aten.split_with_sizes.default) else 1
        dim = node.args[pos] if len(node.args) > pos else node.kwargs.get("dim", 0)
        if node.target is aten.slice.Tensor and (dim % x.dim()) in dyn:
            return _slice_ok(node, x, dim % x.dim())
        if node.target is aten.slice.Tensor and len(node.args) > 2 and \
                isinstance(_val(node.args[2]), torch.SymInt):
            return _gathered_slice_ok(node, x)
        if node.target is aten.select.int:
            return _select_ok(node, x, dim % x.dim())
        if node.target is aten.cat.default:
            return _cat_ok(node, dim)
        dims = [dim]
    return not any((d % x.dim()) in dyn for d in dims)


def _select_ok(node, x, dim) -> bool:
    """select: a static index >= 0 reads the same element of the padded tensor; an index
    that is a size, or a negative one along a dynamic dimension (counted from the true
    size), is gathered at its true value (bounded._select): it must be within the
    dimension at every size within the bounds."""
    idx, size = _val(node.args[2]), x.shape[dim]
    if isinstance(idx, int) and (idx >= 0 or not isinstance(size, torch.SymInt)):
        return True
    e = _expr(idx) if isinstance(idx, torch.SymInt) else _expr(size) + idx
    ref = idx if isinstance(idx, torch.SymInt) else size
    return _polynomial(sympy.expand(e)) and _nonneg(e, ref) and _nonneg(_expr(size) - 1 - e, ref)


def _gathered_slice_ok(node, x) -> bool:
    """A slice of a static dimension from a size (table[n:n+2]): gathered from the true
    start (bounded._gathered_slice), with a static step > 0 and a start >= 0."""
    start = _val(node.args[2])
    step = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
    return isinstance(step, int) and step > 0 and _polynomial(_expr(start)) and \
        _nonneg(_expr(start), start)


def _grows(v) -> bool:
    """Whether each dimension of `v` is at most its padded size (its value with the
    symbols at their bounds) at every size within the bounds: the padded program holds
    the true values in a prefix. A size that shrinks as a symbol grows (table[n:], 20 - n
    rows) would not fit."""
    for s in (v.shape if isinstance(v, torch.Tensor) else []):
        if isinstance(s, torch.SymInt):
            e = _expr(s)
            env = s.node.shape_env
            if not all(a in env.var_to_range and env.var_to_range[a].upper.is_finite
                       for a in e.free_symbols):
                continue  # data-dependent (x[x > 0]): no bound; the op's own rule refuses it
            top = e.xreplace({a: sympy.Integer(int(env.var_to_range[a].upper)) for a in e.free_symbols})
            if not _nonneg(top - e, s):
                return False
    return True


def _nonneg(e, size) -> bool:
    """Whether the size expression `e` is >= 0 at every size within the bounds (of the
    shape environment of SymInt `size`): interval arithmetic over the bounds, sound."""
    e = sympy.expand(e)
    if not e.free_symbols:
        return e >= 0
    from torch.utils._sympy.value_ranges import bound_sympy
    env = size.node.shape_env
    return bool(bound_sympy(e, {s: env.var_to_range[s] for s in e.free_symbols}).lower >= 0)


def _slice_ok(node, x, dim) -> bool:
    """A slice along a dynamic dimension: right when output element i is input element
    start+i (step 1, a static start >= 0) and start + the output's size <= the input's
    size at every size within the bounds (each valid element reads valid data, and the
    valid part stays a prefix), and the padded slice has the output's padded size (its
    end is the output's end: the whole dimension, start + the output's size, or a static
    negative end, which counts from the padded size as the true one does from the size)."""
    a = list(node.args[2:5])
    a += [node.kwargs.get(k, d) for k, d in (("start", 0), ("end", None), ("step", 1))][len(a):]
    return _slice_rule(x.shape[dim], _val(node).shape[dim], *a)


def _slice_rule(sym_size, out, start, end, step) -> bool:
    start = 0 if start is None else start
    if step != 1 or not isinstance(start, int) or start < 0:
        return False  # a symbolic or negative start counts from a size the padding moves
    size, out = _expr(sym_size), _expr(out)
    if not _nonneg(size - start - out, sym_size):
        return False
    end = _val(end)
    if end is None or (isinstance(end, int) and (end >= 2 ** 62 or (
            end >= 0 and _nonneg(end - size, sym_size)))):
        want = size  # an end past the size at every size within the bounds: the whole
    elif isinstance(end, int) and end < 0:
        want = size + end  # from the end: the padded slice's length is the bound's
    elif isinstance(end, (int, torch.SymInt)):
        want = _expr(end)
    else:
        return False
    return sympy.expand(want - start - out) == 0  # compared as expressions: no guard


def _slice_backward_ok(node) -> bool:
    """slice_backward (the slice's gradient: zeros with the gradient at the slice's
    place): row-wise along a static dimension; along a dynamic one, as its slice (the
    rewrite zeroes the gradient's padding, which would land inside the valid part when
    the slice ends before the input's valid part does)."""
    g = _val(node.args[0])
    sizes, dim = [_val(s) for s in node.args[1]], node.args[2] % g.dim()
    if not isinstance(sizes[dim], torch.SymInt):
        return True
    return _slice_rule(sizes[dim], g.shape[dim], *node.args[3:6])


def _select_backward_ok(node) -> bool:
    """select_backward (zeros with the gradient at the index): right along a static
    dimension, where the padding of the others lands in the result's padding (the
    gradient of qkv[:, :, 0] with a dynamic sequence length); along a dynamic one at a
    static index from the start (x[:, 1]: below the true size, Dynamo's guard), whose
    gradient lands at that index of the valid prefix, the padding left zero. At an index
    from the end or a size (x[:, -1]) the rewrite puts it at the true index
    (bounded._select_backward)."""
    return True


def _cat_ok(node, dim) -> bool:
    """cat along a dynamic dimension: right when every operand but the last is static
    along it (the valid part is theirs, then the last's valid prefix, with the padding
    at the end)."""
    xs = [_val(a) for a in node.args[0]]
    d = dim % xs[0].dim()
    return all(not isinstance(x.shape[d], torch.SymInt) for x in xs[:-1])


def _pad_ok(node) -> bool:
    """constant_pad_nd: right when each dynamic dimension's pads are static. Output
    element i is input element i - left, so a left pad or crop keeps the valid part
    where the true op puts it, as does a right crop (it cuts from the padded end, and
    the valid part ends before); a right pad is moved from after the padding to right
    after the valid part (bounded._pad_end). A dynamic pad is refused."""
    x, pads = _val(node.args[0]), list(node.args[1])
    for k in range(len(pads) // 2):
        d = x.dim() - 1 - k
        if isinstance(x.shape[d], torch.SymInt) and not all(
                isinstance(p, int) for p in pads[2 * k:2 * k + 2]):
            return False
    return True


def _index_ok(node) -> bool:
    """index.Tensor with integer indices for the leading dimensions (no None) and the
    others static: output element p reads the data at the index values at p, so valid
    positions (of the indices' broadcast) read valid data, with negative indices along
    dynamic dimensions wrapped by the true size and padded index positions set to 0 in
    the rewrite (bounded._index_args)."""
    x, out = _val(node.args[0]), _val(node)
    idx = [_val(i) for i in node.args[1]]
    if any(i is None or i.dtype not in (torch.int64, torch.int32) for i in idx):
        return False
    rest = list(x.shape[len(idx):])
    if any(isinstance(s, torch.SymInt) for s in rest):
        return False
    nb = max(i.dim() for i in idx)
    if out.dim() != nb + len(rest):
        return False
    lead = [str(_expr(s)) for s in out.shape[:nb]]
    for i in idx:  # each index is 1 or the output's size in each (right-aligned) dimension
        for s, o in zip(reversed(i.shape), reversed(lead)):
            if str(_expr(s)) not in ("1", o):
                return False
    return [str(_expr(s)) for s in out.shape[nb:]] == [str(_expr(s)) for s in rest]


def check_graph(gm: torch.fx.GraphModule) -> None:
    """Raises NotImplementedError naming the first op that touches a dynamic dimension
    and is not known to be computed right under bounded dynamism."""
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        if _is_out_dtype(n.target):
            _check_out_dtype(n)
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
        for v in (_val(n) if isinstance(_val(n), (list, tuple)) else [_val(n)]):
            if not _grows(v):
                _refuse(op, f"has a dimension that shrinks as a dynamic size grows ({tuple(v.shape)})")
        values = _value_args(n)
        if values and torch.Tag.pointwise not in op.tags and op not in _FILLS and \
                not (op in _ARANGES and _arange_length_only(n)):
            _refuse(op, f"uses the dynamic size {', '.join(map(str, values.values()))} as a value")
        for v in values.values():
            if not _polynomial(_expr(v)):
                _refuse(op, f"uses the dynamic size {v} as a value")
        if values and torch.Tag.pointwise in op.tags:
            _tensor_overload(n, values)
        if op in _INDEX_SHAPED:
            if _same_shape(_val(n), _val(n.args[_INDEX_SHAPED[op]])):
                continue
            _refuse(op, "is not shaped like its index")
        if op is aten.index.Tensor:
            if _index_ok(n):
                continue
            _refuse(op, "indexes a dynamic dimension it does not index with integer indices, "
                    "or its output is not shaped like its indices")
        if op is aten.slice_backward.default:
            if _slice_backward_ok(n):
                continue
            _refuse(op, "acts on a dynamic dimension")
        if op is aten.select_backward.default:
            if _select_backward_ok(n):
                continue
            _refuse(op, "acts on a dynamic dimension")
        if op is aten.constant_pad_nd.default:
            if _pad_ok(node=n):
                continue
            _refuse(op, "pads a dynamic dimension by a dynamic amount")
        if op in _POSITIONAL:
            if uses_size:
                _refuse(op, "takes a dynamic size as its diagonal")
            continue
        if op in _SCATTERS:
            if uses_size:
                _refuse(op, "takes a dynamic size as an argument")
            if _scatter_ok(n):
                continue
            _refuse(op, "scatters along a dynamic dimension, or its index's dynamic sizes are "
                    "not its input's")
        if op in _SCANS or op in _REWRITTEN:
            if uses_size:
                _refuse(op, "takes a dynamic size as an argument")
            continue
        if op in _SHAPE_OPS or op in _MASKED_OPS:
            if uses_size and op not in _SHAPE_OPS and op not in _SIZE_ARGS_OK:
                _refuse(op, "takes a dynamic size as an argument")
            continue
        if op in _STATIC_DIM_OPS:
            if _static_dims_ok(n, _STATIC_DIM_OPS[op]):
                continue
            _refuse(op, "acts on a dynamic dimension")
        if op in _ALONG_DIM:
            if uses_size:
                _refuse(op, "takes a dynamic size as an argument")
            if _along_static_dims(n):
                continue
            _refuse(op, "reduces, sorts or selects along a dynamic dimension")
        if op in _MEANS:
            continue  # masked, and the divisor is corrected with the true sizes (bounded._mean)
        if torch.Tag.pointwise in op.tags or op in _UNTAGGED_POINTWISE:
            continue  # sizes used as values become program operands (checked above)
        _refuse(op, "is not in the list of ops supported across a dynamic dimension")


_MEANS = {aten.mean.dim, aten.mean.default}


def _is_out_dtype(target) -> bool:
    return isinstance(target, torch._ops.HigherOrderOperator) and target.name() == "out_dtype"


# out_dtype(op, dtype, *args) (torchao's int8 matmul): ops it may wrap on dynamic sizes.
# mm contracts (its operands masked, bounded._out_dtype_args); the others are pointwise.
_OUT_DTYPE_OK = {aten.mm.default, aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor,
                 aten.div.Scalar}


def _check_out_dtype(n):
    """out_dtype(op, dtype, *args) on dynamic sizes: as its op, where that is known right."""
    ins = n.all_input_nodes
    touches = any(_dyn_dims(_val(a)) for a in ins) or _dyn_dims(_val(n))
    if any(isinstance(_val(a), torch.SymInt) for a in ins):
        _refuse(f"out_dtype({n.args[0]})", "takes a dynamic size as an argument")
    if touches and n.args[0] not in _OUT_DTYPE_OK:
        _refuse(f"out_dtype({n.args[0]})",
                "is not in the list of ops supported across a dynamic dimension")


def _tensor_overload(n, values):
    """The overload of node `n`'s op that takes a Tensor where it takes the sizes `values`
    (by position or name) as numbers (div.Scalar -> div.Tensor, clamp -> clamp.Tensor),
    its other arguments alike (or None): the sizes become 0-d tensors of the true values."""
    op = n.target
    args = op._schema.arguments
    names = {k if isinstance(k, str) else args[k].name for k in values}
    given = [n.args[i] if i < len(n.args) else n.kwargs.get(a.name) for i, a in enumerate(args)]
    for name in op.overloadpacket.overloads():
        cand = getattr(op.overloadpacket, name)
        other = cand._schema.arguments
        if [a.name for a in other] != [a.name for a in args]:
            continue
        if all(("Tensor" in str(b.type)) if a.name in names else
               str(a.type) == str(b.type) or (g is None and str(b.type).startswith("Optional"))
               for a, b, g in zip(args, other, given)):
            return cand
    if all("Tensor" in str(args[i].type) for i in values if isinstance(i, int)) and \
            all(isinstance(i, int) for i in values):
        return op  # it takes tensors there already (mul.Tensor with a size)
    _refuse(op, "uses a dynamic size as a value and has no Tensor overload")


def _mean_dims(n):
    x = _val(n.args[0])
    dims = n.args[1] if n.target is aten.mean.dim and len(n.args) > 1 else None
    return [d % x.dim() for d in dims] if dims else list(range(x.dim()))


def _polynomial(e) -> bool:
    if isinstance(e, (sympy.Symbol, sympy.Integer)):
        return True
    if isinstance(e, (sympy.Add, sympy.Mul)):
        return all(_polynomial(a) for a in e.args)
    return isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 0 and _polynomial(e.base)


def _refuse(op, why):
    raise NotImplementedError(
        f"torch_tpu bounded dynamism: {op} {why}; one program for every size cannot be built "
        f"for it. Supported across dynamic dimensions: pointwise ops, shape ops, sum/mean/amax/"
        f"amin/any/all, cumsum/cumprod/logcumsumexp/cummax/cummin, flip, softmax, mm/bmm/"
        f"addmm, embedding, nll_loss, scaled_dot_product_attention, index with integer "
        f"indices; tril/triu with a static diagonal; scatter along a static dimension; full/new_full/full_like/fill of a size, arange(n); slice with step 1 and a "
        f"static start; select (with an index or a size); cat with every operand but the last "
        f"static along the dimension; layer_norm and split over static dimensions; argmax/max/sort/"
        f"topk/var/std/logsumexp/norm/prod and the like along static dimensions. Mark "
        f"fewer dimensions dynamic or compile with dynamic=False.")



def _expr(s):
    return s.node.expr if isinstance(s, torch.SymInt) else sympy.Integer(int(s))


def _structural(v) -> bool:
    return isinstance(v, torch.Tensor) and all(
        not isinstance(s, torch.SymInt) or isinstance(s.node.expr, sympy.Symbol) for s in v.shape)


def decompositions() -> dict:
    """Decompositions for graphs with bounded dynamic sizes: losses whose mean would
    divide by the padded count become masked sums over the true count (PyTorch's own
    backward decompositions compute 1/numel as a float of the size, which the padded
    program cannot take from its size operands)."""
    from torch._decomp import decomposition_table

    def mse_loss_backward(grad_output, input, target, reduction):
        g = 2 * (input - target) * grad_output
        return g / input.numel() if reduction == 1 else g

    def smooth_l1_loss_backward(grad_output, input, target, reduction, beta):
        x = input - target
        g = torch.where(x.abs() < beta, grad_output * x / beta, grad_output * torch.sign(x))
        return g / input.numel() if reduction == 1 else g

    def huber_loss_backward(grad_output, input, target, reduction, delta):
        x = input - target
        g = torch.where(x < -delta, -grad_output * delta,
                        torch.where(x > delta, grad_output * delta, x * grad_output))
        return g / input.numel() if reduction == 1 else g

    out = {op: decomposition_table[op] for op in (
        aten.mse_loss.default, aten.smooth_l1_loss.default, aten.huber_loss.default)
        if op in decomposition_table}
    out[aten.mse_loss_backward.default] = mse_loss_backward
    out[aten.smooth_l1_loss_backward.default] = smooth_l1_loss_backward
    out[aten.huber_loss_backward.default] = huber_loss_backward
    return out
