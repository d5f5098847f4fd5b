"""Vector norms hold only their order's form: p = 2, 1, 0, inf and -inf each a program of
its own (a value class of the runtime order), other orders one shared program. The 2-norm
of clip_grad_norm_ was all six forms picked by selects, 550 instructions that every fused
training step compiled."""
import json
import os
import shutil
import tempfile

import pytest
import torch

import torch_tpu
from conftest import run_python

ORDERS = [2, 1, 0, float("inf"), float("-inf"), 3, 0.5, -1.5, 2.0, 1.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.complex64], ids=str)
@pytest.mark.parametrize("dim", [None, 0, (0, 1), -1], ids=str)
def test_norm_of_every_order_as_cpu(dtype, dim):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 3, generator=g).to(dtype)
    x[0, 0] = 0  # zeros count for p = 0
    for p in ORDERS:
        if p < 0 and dim is None:
            continue
        want = torch.linalg.vector_norm(x, p, dim)
        got = torch.linalg.vector_norm(x.to("tpu"), p, dim).cpu()
        tol = dict(rtol=2e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got, want, **tol, msg=f"p={p}")
        torch.testing.assert_close(x.to("tpu").norm(p, dim).cpu(), x.norm(p, dim), **tol, msg=f"norm p={p}")


def test_one_element_norms_as_cpu():
    x = torch.tensor([[0.0], [-2.5], [float("nan")]])
    for p in ORDERS:
        torch.testing.assert_close(torch.linalg.vector_norm(x.to("tpu"), p, 1).cpu(),
                                   torch.linalg.vector_norm(x, p, 1), equal_nan=True, msg=f"p={p}")


def test_general_orders_share_one_program():
    x = torch.randn(9, 7, device="tpu")
    torch.linalg.vector_norm(x, 3.0).cpu()
    before = torch_tpu.metrics()["signature_misses"]
    for p in (4.0, 0.25, -2.0, 7.5):
        torch.linalg.vector_norm(x, p, 1).cpu() if p < 0 else torch.linalg.vector_norm(x, p).cpu()
    for p in (5.0, 1.5):
        torch.linalg.vector_norm(x, p).cpu()
    # two plans: the whole-tensor norm and the dim-1 one, whatever the order
    assert torch_tpu.metrics()["signature_misses"] - before == 1


def test_the_two_norm_program_holds_no_power_or_select():
    code = """
import glob, json, os, torch, torch_tpu
x = torch.randn(33, 17, device="tpu")
torch.linalg.vector_norm(x).cpu(); x.norm(2, 1).cpu()
torch.tpu.synchronize()
texts = [open(f).read() for f in glob.glob(os.path.join(os.environ["DUMP"], "*before_optimizations.txt"))]
print(json.dumps([len(texts), sum(" power(" in t for t in texts), sum(" select(" in t for t in texts),
                  sum(" sqrt(" in t for t in texts)]))
"""
    dump = tempfile.mkdtemp(prefix="tpu_norm_dump_")
    try:
        r = run_python(code, env={"XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text", "DUMP": dump,
                                  "TPU_COMPILE_CACHE": "0", "TPU_DEFER_AND_FUSE": "0", "TPU_LAUNCH_BLOCKING": "0"})
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    programs, powers, selects, sqrts = json.loads(r.stdout.strip().splitlines()[-1])
    assert programs >= 2 and sqrts >= 2  # the dump holds both norms' programs
    assert powers == 0 and selects == 0


def test_clip_grad_norm_as_cpu():
    torch.manual_seed(0)
    cpu = [torch.nn.Parameter(torch.randn(s)) for s in [(4, 3), (5,), (2, 2, 2)]]
    tpu = [torch.nn.Parameter(p.detach().to("tpu")) for p in cpu]
    for p, q in zip(cpu, tpu):
        p.grad = torch.randn_like(p) * 3
        q.grad = p.grad.to("tpu")
    for norm_type in (2.0, 1.0, float("inf"), 3.0):
        want = torch.nn.utils.clip_grad_norm_(cpu, 0.5, norm_type)
        got = torch.nn.utils.clip_grad_norm_(tpu, 0.5, norm_type)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
        for p, q in zip(cpu, tpu):
            torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-6)
