"""Custom JAX and Pallas kernels as PyTorch ops: `jax_op`.

    @jax_op("mylib::rmsnorm")
    def rmsnorm(x: jax.Array, w: jax.Array, eps: float = 1e-6) -> jax.Array:
        ...

makes `torch.ops.mylib.rmsnorm` (and returns it, a `torch.library` custom op). Parameters
annotated `jax.Array` (or `Optional[jax.Array]`) take tpu tensors; the others are static
(compile-time) values. Per signature (input shapes, dtypes, static values) the function
is exported once with `jax.export` for the plugin's platform; its StableHLO is spliced
into our own programs (torch_tpu::call_stablehlo): its own program in Strict mode, part
of the fused graph in DeferAndFuse and under torch.compile. No JAX runtime runs at
execution. Without `op.register_autograd(...)` the op differentiates through `jax.vjp`
(the backward is itself a jax_op). JAX is imported by the first `jax_op`, never by
`import torch_tpu`.
"""
import collections.abc
import functools
import inspect
import re
import threading
import types
import typing
import warnings

import torch

from .. import _C

# torch dtype -> StableHLO element type, for the C++ importer.
_ELEM = {
    torch.bool: "i1", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32",
    torch.int64: "i64", torch.uint8: "ui8", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.float32: "f32", torch.float64: "f64", torch.complex64: "complex<f32>",
    torch.complex128: "complex<f64>",
}
_WIDE = (torch.int64, torch.float64, torch.complex128)  # need JAX's x64 mode

_TENSOR, _OPT_TENSOR, _STATIC = "tensor", "optional tensor", "static"
_VARIADIC = "..."  # n_outs of tuple[jax.Array, ...]: the export says how many


def _jax():
    import jax  # the first jax_op pays for it
    import jax.export  # noqa: F401
    return jax


def _kind(annotation, jax) -> str:
    if annotation is jax.Array:
        return _TENSOR
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # Optional / X | None
        args = typing.get_args(annotation)
        if len(args) == 2 and jax.Array in args and type(None) in args:
            return _OPT_TENSOR
    return _STATIC


def _torch_annotation(annotation, default):
    """The annotation torch.library's schema inference understands for a static."""
    if annotation is inspect.Parameter.empty:
        if default is inspect.Parameter.empty or default is None:
            return None
        return type(default)
    origin = typing.get_origin(annotation)
    if origin in (tuple, list, collections.abc.Sequence):
        elems = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        if elems and all(e is elems[0] for e in elems) and elems[0] in (int, float, bool):
            return typing.Sequence[elems[0]]
    return annotation


def _freeze(v):
    return tuple(_freeze(x) for x in v) if isinstance(v, (list, tuple)) else v


def _keyed(v):
    """A static as a cache key: 0.0 == -0.0 and True == 1 as dict keys, but not as
    statics (x / -0.0 is -inf); float.hex tells the signs apart and keys every NaN alike."""
    if isinstance(v, (list, tuple)):
        return tuple(_keyed(x) for x in v)
    return (float, v.hex()) if isinstance(v, float) else (type(v), v)


class _Entry:
    """One exported signature: the imported module and its outputs."""

    def __init__(self, module_id, kept, out_specs):
        self.module_id = module_id
        self.kept = kept            # indices (among present tensors) the module reads
        self.out_specs = out_specs  # [(shape, torch dtype)]


class JaxOp:
    """The state behind one jax_op: parameters, exported signatures, the custom op."""

    def __init__(self, name, fn, donate_argnums, params=None, n_outs=None):
        jax = _jax()
        self.name, self.fn = name, fn
        self.sig = inspect.signature(fn)
        if params is None:
            try:
                hints = typing.get_type_hints(fn)
            except Exception:  # unresolvable string annotations: use them as written
                hints = {}
            params = []
            for p in self.sig.parameters.values():
                ann = hints.get(p.name, p.annotation)
                params.append((p.name, _kind(ann, jax), ann))
            ret = hints.get("return", self.sig.return_annotation)
            n_outs = None
            if typing.get_origin(ret) in (tuple, typing.Tuple):
                rargs = typing.get_args(ret)
                n_outs = _VARIADIC if rargs[1:] == (Ellipsis,) else len(rargs)
        self.params = params  # [(name, kind, annotation)]
        self.n_outs = n_outs  # None: one tensor; _VARIADIC: a list of as many as it returns
        tensor_names = [n for n, k, _ in params if k != _STATIC]
        if not tensor_names:
            raise TypeError(f"jax_op {name}: no parameter is annotated jax.Array "
                            "(tensor parameters must be; the others are static)")
        donate = () if donate_argnums is None else (
            (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums))
        for i in donate:
            if not 0 <= i < len(params) or params[i][1] == _STATIC:
                raise ValueError(f"jax_op {name}: donate_argnums {i} is not a tensor parameter")
        self.donate = donate
        self._lock = threading.Lock()
        self._entries = {}
        self._vjp = None  # the automatic backward, made on first use
        self.op = self._define()

    # -- the torch.library op --------------------------------------------------------
    def _define(self):
        new_params, seq_defaults = [], {}
        for (pname, kind, ann), p in zip(self.params, self.sig.parameters.values()):
            if kind == _TENSOR:
                t = torch.Tensor
            elif kind == _OPT_TENSOR:
                t = typing.Optional[torch.Tensor]
            else:
                t = _torch_annotation(ann, p.default)
                if t is None:
                    raise TypeError(f"jax_op {self.name}: static parameter '{pname}' needs a type "
                                    "annotation (int, float, bool, str, Sequence[int], ...) or a default")
                if p.default is None:  # a schema's None default needs an optional type
                    t = typing.Optional[t]
                elif isinstance(p.default, (list, tuple)):
                    # infer_schema takes no sequence default: None stands in for it, and
                    # the schema gets the list written in below.
                    seq_defaults[pname] = "[" + ", ".join(map(str, p.default)) + "]"
                    p = p.replace(default=None)
            new_params.append(p.replace(annotation=t))
        # The schema is made before any export: a variadic tuple's count is unknown, so
        # its op returns Tensor[] (a list).
        ret = (torch.Tensor if self.n_outs is None else typing.List[torch.Tensor]
               if self.n_outs is _VARIADIC else typing.Tuple[(torch.Tensor,) * self.n_outs])
        proto = lambda *a, **k: None  # noqa: E731
        proto.__signature__ = inspect.Signature(new_params, return_annotation=ret)
        try:
            schema = torch.library.infer_schema(proto, mutates_args=())
        except ValueError as err:  # a static of a type no op schema can hold
            raise TypeError(f"jax_op {self.name}: {err}") from None
        for pname, default in seq_defaults.items():
            schema = re.sub(rf"(\s{pname})=None(?=[,)])", rf"\1={default}", schema)
        # Every device reaches the kernel, which names the op when a tensor is not on tpu.
        try:
            op = torch.library.custom_op(self.name, mutates_args=(), schema=schema)(self._kernel)
        except RuntimeError as err:
            if not seq_defaults:
                raise
            raise TypeError(f"jax_op {self.name}: a sequence default "
                            f"({', '.join(f'{n}={d}' for n, d in seq_defaults.items())}) does not "
                            f"fit the op's schema {schema}: {err}") from None
        op.register_fake(self._fake)
        op.register_autograd(self._vjp_backward, setup_context=self._vjp_setup)
        return op

    def _split(self, args, kwargs):
        bound = self.sig.bind(*args, **kwargs)
        bound.apply_defaults()
        # A sequence static reaches the function as a tuple, forward and backward alike:
        # hashable, as JAX's static arguments are (the op's schema hands over a list).
        values = [_freeze(bound.arguments[n]) if k == _STATIC else bound.arguments[n]
                  for n, k, _ in self.params]
        for (pname, kind, _), v in zip(self.params, values):
            if kind == _TENSOR and not isinstance(v, torch.Tensor):
                raise TypeError(f"jax_op {self.name}: argument '{pname}' must be a tensor, "
                                f"got {type(v).__name__}")
        return values

    def _shape(self, pname, v):
        """A tensor's sizes as ints: the function is exported per shape. Under torch.compile
        a size dynamic only as a hint (dynamic=True, automatic dynamic) is specialized by a
        guard, Dynamo compiling again for another size; one marked dynamic cannot be."""
        if all(type(d) is int for d in v.shape):
            return tuple(v.shape)
        from torch.fx.experimental.symbolic_shapes import guard_int
        from torch.utils._sympy.numbers import int_oo
        from .compile import _strictly_dynamic
        strict = _strictly_dynamic()
        sizes = []
        for d in v.shape:
            if isinstance(d, torch.SymInt):
                ranges = d.node.shape_env.var_to_range
                for sym in d.node.expr.free_symbols:
                    r = ranges.get(sym)
                    if sym in strict or (r is not None and r.upper != int_oo and r.upper.is_number):
                        raise NotImplementedError(
                            f"jax_op {self.name}: argument '{pname}' has the dynamic size {d} "
                            f"(shape {tuple(v.shape)}), marked by mark_dynamic; a jax_op is "
                            "exported per shape and needs static sizes: drop the mark on its "
                            "inputs or compile with torch.compile(..., dynamic=False)")
                d = guard_int(d)
            sizes.append(int(d))
        return tuple(sizes)

    def _key(self, values):
        key = []
        for (pname, kind, _), v in zip(self.params, values):
            if kind == _STATIC:
                key.append(("s", _keyed(v)))
            elif v is None:
                key.append(None)
            else:
                key.append((self._shape(pname, v), v.dtype))
        return tuple(key)

    def _entry(self, values):
        key = self._key(values)
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                e = self._export(values)
                self._entries[key] = e
        return e

    def _kernel(self, *args, **kwargs):
        values = self._split(args, kwargs)
        present = []
        for (pname, kind, _), v in zip(self.params, values):
            if kind != _STATIC and v is not None:
                if v.device.type != "tpu":
                    raise RuntimeError(f"jax_op {self.name}: argument '{pname}' is on {v.device}; "
                                       "expected a tpu tensor")
                present.append(v)
        e = self._entry(values)
        if e.kept:
            outs = torch.ops.torch_tpu.call_stablehlo([present[i] for i in e.kept], e.module_id)
        else:
            # A function of its inputs' shapes only (jax.export dropped every argument):
            # no tensor is left to say the device, so the call goes to tpu by name.
            with torch.tpu.device_of(present[0] if present else None):
                outs = torch.ops.torch_tpu.call_stablehlo.default._op_dk(torch._C.DispatchKey.PrivateUse1, [], e.module_id)
        if self.donate:
            _donated(self, values)
        return self._pack(outs)

    def _pack(self, outs):
        return (outs[0] if self.n_outs is None else list(outs) if self.n_outs is _VARIADIC
                else tuple(outs))

    def _fake(self, *args, **kwargs):
        values = self._split(args, kwargs)
        # No tensor passed (every Optional one None): the current device, as in _kernel.
        device = next((v.device for (_, k, _), v in zip(self.params, values)
                       if k != _STATIC and v is not None), None)
        if device is None:
            device = torch.device("tpu", torch.tpu.current_device())
        e = self._entry(values)
        outs = [torch.empty(s, dtype=d, device=device) for s, d in e.out_specs]
        return self._pack(outs)

    # -- export ------------------------------------------------------------------------
    def _call_fn(self, values):
        args, kwargs = [], {}
        for p, v in zip(self.sig.parameters.values(), values):
            if p.kind == p.KEYWORD_ONLY:
                kwargs[p.name] = v
            else:
                args.append(v)
        return self.fn(*args, **kwargs)

    def _describe(self, values):
        parts = []
        for (pname, kind, _), v in zip(self.params, values):
            if kind == _STATIC:
                parts.append(f"{pname}={v!r}")
            elif v is None:
                parts.append(f"{pname}=None")
            else:
                parts.append(f"{pname}: {str(v.dtype).replace('torch.', '')}{list(v.shape)}")
        return ", ".join(parts)

    def _export(self, values):
        jax = _jax()
        slots = [i for i, ((_, k, _), v) in enumerate(zip(self.params, values))
                 if k != _STATIC and v is not None]
        for i in slots:
            if values[i].dtype not in _ELEM:
                raise TypeError(f"jax_op {self.name}: argument '{self.params[i][0]}' has dtype "
                                f"{values[i].dtype}, which JAX ops on tpu do not take")
        shapes = {i: self._shape(self.params[i][0], values[i]) for i in slots}
        specs = [jax.ShapeDtypeStruct(shapes[i],
                                      jax.numpy.dtype(str(values[i].dtype).replace("torch.", "")))
                 for i in slots]

        def flat(*arrays):
            vals = list(values)
            for i, a in zip(slots, arrays):
                vals[i] = a
            out = self._call_fn(vals)
            return out

        donate = tuple(slots.index(i) for i in self.donate if i in slots)
        wide = any(values[i].dtype in _WIDE for i in slots)
        platform = _jax_platform()
        try:
            with _x64(jax, wide):
                exported = jax.export.export(jax.jit(flat, donate_argnums=donate),
                                             platforms=[platform])(*specs)
        except Exception as err:
            raise RuntimeError(f"jax_op {self.name}: the JAX function fails for "
                               f"({self._describe(values)}): {type(err).__name__}: {err}") from err
        outs = exported.out_avals
        if self.n_outs is None and len(outs) != 1:
            raise RuntimeError(f"jax_op {self.name}: the function returns {len(outs)} arrays; "
                               "annotate its return as tuple[jax.Array, ...] for several")
        if self.n_outs not in (None, _VARIADIC) and len(outs) != self.n_outs:
            raise RuntimeError(f"jax_op {self.name}: the function returns {len(outs)} arrays, "
                               f"its annotation says {self.n_outs}")
        if exported.ordered_effects or exported.unordered_effects:
            raise RuntimeError(f"jax_op {self.name}: functions with side effects cannot run on tpu")
        out_specs = []
        for a in outs:
            dt = getattr(torch, a.dtype.name, None)
            if dt not in _ELEM:
                raise TypeError(f"jax_op {self.name}: an output has dtype {a.dtype}, "
                                "which tpu tensors cannot hold")
            out_specs.append((tuple(int(d) for d in a.shape), dt))
        kept = sorted(exported.module_kept_var_idx)
        text = _generic_text(exported)
        if "lapack_" in text:
            lapack = [(t, where) for t, where in _custom_calls(exported) if t.startswith("lapack_")]
            if lapack:
                raise NotImplementedError(
                    f"jax_op {self.name}: the JAX function ({self._describe(values)}) uses "
                    f"{', '.join(sorted({w for _, w in lapack}))} (jnp.linalg / jax.scipy.linalg), "
                    f"which JAX lowers for {platform} to jaxlib's LAPACK custom calls "
                    f"({', '.join(sorted({t for t, _ in lapack}))}); those run only in JAX's own "
                    "CPU runtime and are not available through PJRT plugins, so they cannot run "
                    "in a jax_op: do the linear algebra outside it")
        params = [(_ELEM[values[slots[i]].dtype], list(shapes[slots[i]])) for i in kept]
        results = [(_ELEM[d], list(s)) for s, d in out_specs]
        mid = _C._import_stablehlo(text, self.name, params, results)
        return _Entry(mid, kept, out_specs)

    # -- autograd through jax.vjp --------------------------------------------------------
    def _vjp_setup(self, ctx, inputs, output):
        ctx.jax_values = list(inputs)
        tensors = [v for (_, k, _), v in zip(self.params, inputs) if k != _STATIC and v is not None]
        ctx.save_for_backward(*tensors)

    def _vjp_backward(self, ctx, *grads):
        if self.n_outs is _VARIADIC:  # Tensor[]'s gradients come as one list
            (grads,) = grads
        saved = iter(ctx.saved_tensors)
        values = [_freeze(v) if k == _STATIC else None if v is None else next(saved)
                  for (_, k, _), v in zip(self.params, ctx.jax_values)]
        diff = [i for i, ((_, k, _), v) in enumerate(zip(self.params, values))
                if k != _STATIC and v is not None and (v.is_floating_point() or v.is_complex())]
        if not diff:  # nothing differentiable among the inputs
            return (None,) * len(self.params)
        outs = []
        for g, (shape, dt) in zip(grads, self._entry(values).out_specs):
            outs.append(g if g is not None else torch.zeros(shape, dtype=dt, device=values[diff[0]].device))
        bwd = _vjp_op(self)
        args = [values[i] for i, (_, k, _) in enumerate(self.params) if k != _STATIC and values[i] is not None]
        statics = tuple((n, v) for (n, k, _), v in zip(self.params, values) if k == _STATIC)
        present = tuple(i for i, (_, k, _) in enumerate(self.params) if k != _STATIC and values[i] is not None)
        res = bwd.call(args + outs, present, diff, statics, len(outs))
        res = (res,) if isinstance(res, torch.Tensor) else res
        grads_in = [None] * len(self.params)
        for i, r in zip(diff, res):
            grads_in[i] = r
        return tuple(grads_in)


def _x64(jax, wide):
    """JAX's 64-bit mode for the export when an input is 64-bit (else JAX narrows it)."""
    import contextlib
    if not wide:
        return contextlib.nullcontext()
    enable = getattr(jax, "enable_x64", None)  # a context-manager config state
    if enable is None:
        from jax.experimental import enable_x64 as enable
        return enable()
    return enable(True)


def _jax_platform() -> str:
    p = _C.platform().lower()
    return {"gpu": "cuda", "host": "cpu"}.get(p, p)


def _operations(op):
    """Every operation nested in op, depth first."""
    for region in op.regions:
        for block in region.blocks:
            for o in block.operations:
                yield o
                yield from _operations(o.operation)


# (exponent, mantissa) bits of the narrow floats whose rounding XLA may drop.
_NARROW_BITS = {"bf16": (8, 7), "f16": (5, 10)}


def _pin_narrow_rounding(module, ir):
    """XLA:CPU computes bf16/f16 ops in f32 and, allowed excess precision, folds away the
    convert pair around each, so (a.astype(bf16) * 3).astype(f32) came out unrounded
    (JAX on CPU and torch round it). A reduce_precision to the narrow type after each
    widening convert keeps the rounding; where the value is already narrow it changes
    nothing. (Our own rules round each step explicitly, which XLA keeps.)"""
    from jax._src.lib.mlir.dialects import hlo
    i32 = ir.IntegerType.get_signless(32)
    for o in list(_operations(module.operation)):
        if o.operation.name != "stablehlo.convert":
            continue
        bits = _NARROW_BITS.get(str(ir.RankedTensorType(o.operands[0].type).element_type))
        wide = str(ir.RankedTensorType(o.result.type).element_type)
        if bits is None or wide not in ("f32", "f64"):
            continue
        with ir.InsertionPoint.after(o), o.location:
            rounded = hlo.ReducePrecisionOp(o.result, exponent_bits=ir.IntegerAttr.get(i32, bits[0]),
                                            mantissa_bits=ir.IntegerAttr.get(i32, bits[1]))
        o.result.replace_all_uses_except(rounded.result, rounded.operation)


def _generic_text(exported) -> str:
    """The module in MLIR's generic form without locations: what every MLIR parser that
    knows the ops reads (the pretty syntax of each op changes between versions)."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir
    with jax_mlir.make_ir_context():
        module = ir.Module.parse(exported.mlir_module())
        _pin_narrow_rounding(module, ir)
        return module.operation.get_asm(enable_debug_info=False, print_generic_op_form=True)


def _custom_calls(exported):
    """[(call_target_name, the JAX primitive it lowers)] of the module's custom calls."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir
    found = []
    with jax_mlir.make_ir_context():
        for o in _operations(ir.Module.parse(exported.mlir_module()).operation):
            if o.operation.name == "stablehlo.custom_call":
                where = re.match(r'loc\("([^"]*)"', str(o.location))
                found.append((ir.StringAttr(o.attributes["call_target_name"]).value,
                              where.group(1).rsplit("/", 1)[-1] if where else "?"))
    return found


class _VjpOp:
    """The backward of a JaxOp without a registered one: a jax_op over
    (primal tensors..., output cotangents...) -> input cotangents, from jax.vjp."""

    def __init__(self, fwd: JaxOp):
        self.fwd = fwd
        self._ops = {}
        self._lock = threading.Lock()

    def call(self, tensors, present, diff, statics, n_out):
        key = (present, tuple(diff), tuple((n, _keyed(v)) for n, v in statics), n_out)
        with self._lock:
            op = self._ops.get(key)
            if op is None:
                op = self._ops[key] = self._make(present, diff, dict(statics), n_out, len(self._ops))
        return op.op(*tensors)

    def _make(self, present, diff, statics, n_out, n):
        jax = _jax()
        fwd = self.fwd

        def vjp(*arrays):
            primals, cts = arrays[:len(present)], arrays[len(present):]
            values = [statics.get(name) if k == _STATIC else None for name, k, _ in fwd.params]

            def f(*d):
                vals = list(values)
                for i, a in zip(present, primals):
                    vals[i] = a
                for i, a in zip(diff, d):
                    vals[i] = a
                out = fwd._call_fn(vals)
                # The cotangents' structure must be the outputs': a tuple, even if it
                # returned a list.
                return out if fwd.n_outs is None else tuple(out) if isinstance(out, (list, tuple)) else (out,)

            # Outputs without a gradient (integers) take JAX's float0 cotangents.
            import numpy as np
            jnp = jax.numpy
            # JAX's vjp of a complex value is the conjugate of PyTorch's gradient (for a
            # real loss, JAX gives dL/dz and PyTorch dL/dconj(z)): conjugate on the way in
            # and on the way out, so both match torch's autograd.
            cts = [_conj(jnp, c) if jnp.issubdtype(c.dtype, jnp.inexact)
                   else np.zeros(c.shape, jax.dtypes.float0) for c in cts]
            _, pullback = jax.vjp(f, *[primals[present.index(i)] for i in diff])
            g = [_conj(jnp, x) for x in pullback(cts[0] if fwd.n_outs is None else tuple(cts))]
            return g[0] if len(diff) == 1 else tuple(g)

        names = [f"p{i}" for i in range(len(present))] + [f"g{i}" for i in range(n_out)]
        params = [(nm, _TENSOR, jax.Array) for nm in names]
        vjp.__signature__ = inspect.Signature(
            [inspect.Parameter(nm, inspect.Parameter.POSITIONAL_OR_KEYWORD) for nm in names])
        ns, base = fwd.name.split("::")
        return JaxOp(f"{ns}::{base}_vjp{n}", vjp, None, params=params,
                     n_outs=None if len(diff) == 1 else len(diff))


def _conj(jnp, x):
    return jnp.conj(x) if jnp.issubdtype(x.dtype, jnp.complexfloating) else x


def _vjp_op(fwd: JaxOp) -> "_VjpOp":
    if fwd._vjp is None:
        fwd._vjp = _VjpOp(fwd)
    return fwd._vjp


def _donated(op: JaxOp, values):
    """Donated tensors are consumed: their memory goes back once the op has run."""
    for i in op.donate:
        v = values[i]
        if isinstance(v, torch.Tensor):
            _C._donate(v, f"{op.name} (donate_argnums={i})")


def jax_op(name, fn=None, /, *, donate_argnums=None):
    """Turns the JAX function `fn` into the PyTorch custom op `name` ("ns::op").

    Usable as `jax_op("ns::op", fn)` or as the decorator `@jax_op("ns::op")`. Returns the
    `torch.library` custom op (call it, or `torch.ops.ns.op`); `op.register_autograd`
    replaces the automatic backward from `jax.vjp`. `donate_argnums` names tensor
    parameters the call consumes: their memory is released once the op has run and
    reading them afterwards raises.
    """
    if not isinstance(name, str) or name.count("::") != 1:
        raise ValueError(f"jax_op: name must look like 'namespace::op', got {name!r}")
    if fn is None:
        return functools.partial(jax_op, name, donate_argnums=donate_argnums)
    return JaxOp(name, fn, donate_argnums).op


def custom_jax_kernel(name, fn=None, /, *, donate_argnums=None):
    """Deprecated: the older name of `jax_op`."""
    warnings.warn("torch_tpu custom_jax_kernel is deprecated; use torch_tpu.pallas.jax_op",
                  DeprecationWarning, stacklevel=2)
    return jax_op(name, fn, donate_argnums=donate_argnums)


__all__ = ["jax_op", "custom_jax_kernel"]
