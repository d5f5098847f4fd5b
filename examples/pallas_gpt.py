"""A Pallas kernel inside the GPT: the MLP's bias add + GELU as one fused kernel.

`jax_op` turns the JAX/Pallas function into a PyTorch op on tpu tensors; its backward
is another jax_op, registered with `op.register_autograd`. The GPT trains with it and
its losses match the plain model's. On this CPU plugin Pallas runs in interpret mode
(plain StableHLO); on a TPU plugin the same kernel lowers to a Mosaic custom call.
"""
import os
import sys

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F
from jax.experimental import pallas as pl

sys.path.insert(0, os.path.dirname(__file__))
from gpt import GPT, batches  # noqa: E402

import torch_tpu  # noqa: E402
from torch_tpu.pallas import jax_op  # noqa: E402

INTERPRET = torch_tpu._C.platform().lower() != "tpu"  # Mosaic needs a TPU
ROWS = 8  # rows of x per kernel instance


def _add_gelu_kernel(x_ref, b_ref, o_ref):
    o_ref[...] = jax.nn.gelu(x_ref[...] + b_ref[...], approximate=False)


@jax_op("examples::add_gelu")
def add_gelu(x: jax.Array, b: jax.Array) -> jax.Array:
    """gelu(x + b) over the last dimension, one block of ROWS rows per grid step."""
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    block = ROWS if rows.shape[0] % ROWS == 0 else rows.shape[0]
    out = pl.pallas_call(
        _add_gelu_kernel,
        out_shape=jax.ShapeDtypeStruct(rows.shape, rows.dtype),
        grid=(rows.shape[0] // block,),
        in_specs=[pl.BlockSpec((block, d), lambda i: (i, 0)), pl.BlockSpec((1, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((block, d), lambda i: (i, 0)),
        interpret=INTERPRET,
    )(rows, b.reshape(1, d))
    return out.reshape(x.shape)


@jax_op("examples::add_gelu_backward")
def add_gelu_backward(x: jax.Array, b: jax.Array, grad: jax.Array) -> tuple[jax.Array, jax.Array]:
    _, pullback = jax.vjp(lambda z: jax.nn.gelu(z, approximate=False), x + b)
    dx = pullback(grad)[0]
    return dx, dx.reshape(-1, x.shape[-1]).sum(0)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    x, b = ctx.saved_tensors
    return add_gelu_backward(x, b, grad)


add_gelu.register_autograd(_backward, setup_context=_setup)


def use_pallas_mlp(model: GPT) -> GPT:
    """Routes each block's `gelu(fc(h))` through the Pallas kernel (same math)."""
    for blk in model.blocks:
        fc, out, ln2 = blk.fc, blk.out, blk.ln2

        def mlp(h, fc=fc, out=out, ln2=ln2):
            return out(add_gelu(F.linear(ln2(h), fc.weight), fc.bias))

        def forward(x, blk=blk, mlp=mlp):
            b, t, d = x.shape
            q, k, v = blk.qkv(blk.ln1(x)).split(d, dim=-1)
            q, k, v = (z.view(b, t, blk.n_heads, d // blk.n_heads).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk.drop(blk.proj(a.transpose(1, 2).reshape(b, t, d)))
            return x + blk.drop(mlp(x))

        blk.forward = forward
    return model


def train(pallas: bool, steps: int = 5, device: str = "tpu", compiled: bool = False):
    """Losses of a few AdamW steps of the GPT, plain or with the Pallas MLP."""
    torch.manual_seed(0)
    vocab, seq, batch = 64, 16, 4
    model = GPT(vocab=vocab, seq=seq, d_model=32, n_heads=2).to(device)
    if pallas:
        use_pallas_mlp(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step_fn = model if not compiled else torch.compile(model, backend="tpu")
    losses = []
    for x, y in batches(vocab, seq, batch, steps):
        _, loss = step_fn(x.to(device), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    plain, fused = train(False), train(True)
    for i, (a, b) in enumerate(zip(plain, fused)):
        print(f"step {i}  plain {a:.6f}  pallas {b:.6f}")
