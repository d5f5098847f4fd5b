"""torch.set_float32_matmul_precision reaches the programs: XLA's own default for a dot
or convolution without `precision_config` is one bf16 pass on TPU (and TF32 on a GPU),
not the f32 product PyTorch computes by default. The CPU plugin computes f32 whatever
the attribute says, so these tests read the HLO XLA was given (its dump) and the
signature cache, not values."""

import pytest
import torch

import torch_tpu
from conftest import run_python_json

# One fresh process, no disk cache (a hit compiles nothing, so dumps nothing): each phase
# reports the precisions of the dots and convolutions XLA compiled during it.
PHASES = r"""
import glob, json, os, re, sys, torch, torch_tpu
import torch.nn.functional as F
dump = os.environ["XLA_FLAGS"].split("=", 1)[1]
seen = set()
def compiled():
    out = []
    for f in sorted(glob.glob(os.path.join(dump, "*before_optimizations.txt"))):
        if f in seen:
            continue
        seen.add(f)
        for line in open(f):
            m = re.search(r"= \S+ (dot|convolution)\(", line)
            if m:
                p = re.search(r"operand_precision=\{(\w+),(\w+)\}", line)
                out.append(m.group(1) + ":" + (p.group(1) if p else "default"))
    return sorted(out)
def misses():
    return torch_tpu.metrics()["signature_misses"]
g = torch.Generator().manual_seed(0)
a, b = (torch.randn(8, 16, generator=g).to("tpu"), torch.randn(16, 4, generator=g).to("tpu"))
img, w = torch.randn(1, 2, 6, 6, generator=g).to("tpu"), torch.randn(3, 2, 3, 3, generator=g).to("tpu")
r = {}
def phase(name, fn):
    m0 = misses()
    v = fn().cpu()
    r[name] = {"compiled": compiled(), "misses": misses() - m0, "sum": float(v.double().sum())}
phase("mm", lambda: a @ b)
torch.set_float32_matmul_precision("high")
phase("mm_high", lambda: a @ b)
phase("add_high", lambda: a + 1)
torch.set_float32_matmul_precision("medium")
phase("mm_medium", lambda: a @ b)
phase("bf16_medium", lambda: a.bfloat16() @ b.bfloat16())
phase("conv_medium", lambda: F.conv2d(img, w))
phase("pool_medium", lambda: F.adaptive_avg_pool2d(img, (4, 4)))
torch.set_float32_matmul_precision("highest")
phase("mm_again", lambda: a @ b)
phase("bf16_highest", lambda: a.bfloat16() @ b.bfloat16())
phase("conv", lambda: F.conv2d(img, w))
with torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
    torch.set_float32_matmul_precision("medium")
    phase("fused_medium", lambda: (a * 2) @ b + 1)
    torch.set_float32_matmul_precision("highest")
    phase("fused_highest", lambda: (a * 2) @ b + 1)
f = torch.compile(lambda x, y: torch.relu(x @ y) * 3, backend="tpu")
torch.set_float32_matmul_precision("high")
phase("compiled_high", lambda: f(a, b))
phase("compiled_high_again", lambda: f(a, b))
torch.set_float32_matmul_precision("medium")
phase("compiled_medium", lambda: f(a, b))
print(json.dumps(r))
"""


@pytest.fixture(scope="module")
def phases(tmp_path_factory):
    dump = tmp_path_factory.mktemp("xla_dump")
    return run_python_json(PHASES, env={"XLA_FLAGS": f"--xla_dump_to={dump}", "TPU_COMPILE_CACHE": "0"})


def test_f32_matmuls_follow_the_setting_and_recompile_when_it_changes(phases):
    assert phases["mm"]["compiled"] == ["dot:highest"]  # PyTorch's default: full f32
    assert phases["mm_high"]["compiled"] == ["dot:high"] and phases["mm_high"]["misses"] == 1
    assert phases["mm_medium"]["compiled"] == ["dot:default"] and phases["mm_medium"]["misses"] == 1
    # Back at a precision planned before: its program is found again, nothing compiles.
    assert phases["mm_again"] == {**phases["mm"], "compiled": [], "misses": 0}
    assert phases["mm_high"]["sum"] == phases["mm"]["sum"]  # the CPU plugin's f32 either way


def test_ops_without_f32_products_ignore_the_setting(phases):
    assert phases["add_high"]["compiled"] == [] and phases["add_high"]["misses"] == 1
    # bf16 operands are multiplied as they are: one program for every setting.
    assert phases["bf16_medium"]["compiled"] == ["dot:default"]
    assert phases["bf16_highest"]["misses"] == 0 and phases["bf16_highest"]["compiled"] == []


def test_convolutions_follow_it_and_pooling_stays_exact(phases):
    assert phases["conv_medium"]["compiled"] == ["convolution:default"]
    assert phases["conv"]["compiled"] == ["convolution:highest"]
    # adaptive pooling averages through a product that is not a matmul to the user.
    assert phases["pool_medium"]["compiled"] == ["dot:highest", "dot:highest"]


def test_fused_and_compiled_graphs_follow_it(phases):
    assert phases["fused_medium"]["compiled"] == ["dot:default"]
    assert phases["fused_highest"]["compiled"] == ["dot:highest"]
    assert phases["compiled_high"]["compiled"] == ["dot:high"]
    assert phases["compiled_high_again"]["compiled"] == []  # replayed
    # Dynamo does not recompile between "high" and "medium": the capture declines.
    assert phases["compiled_medium"]["compiled"] == ["dot:default"]
    assert phases["compiled_medium"]["sum"] == phases["compiled_high"]["sum"]


def test_mixed_precision_apis_do_not_break_ops():
    # PyTorch refuses torch.get_float32_matmul_precision() once the legacy and the
    # per-backend settings disagree; a matmul must still run (as the CUDA setting says).
    before = torch.backends.cuda.matmul.fp32_precision
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        with pytest.raises(RuntimeError):
            torch.get_float32_matmul_precision()
        x = torch.randn(5, 7)
        y = torch.randn(7, 3)
        torch.testing.assert_close((x.to("tpu") @ y.to("tpu")).cpu(), x @ y)
    finally:
        torch.backends.cuda.matmul.fp32_precision = before
        torch.set_float32_matmul_precision("highest")
    assert torch.get_float32_matmul_precision() == "highest"
