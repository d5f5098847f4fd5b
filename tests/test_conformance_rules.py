"""The conformance tool counts only what it verifies: every reference input (not the first
8), layouts kept on the device, outputs compared structurally, error inputs raising as on
CPU, random ops tested against their documented law."""
import math
import re

import pytest
import torch
from torch.testing._internal.opinfo.core import SampleInput

from torch_tpu import conformance, conformance_random


class FakeOp:
    """Just enough of an OpInfo for call(): a name and a callable."""

    def __init__(self, fn, name="fake"):
        self.fn, self.name = fn, name

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def test_samples_keep_strides_offsets_and_expansion_on_the_device():
    base = torch.arange(60.0).reshape(6, 10)
    cases = [base.t(), base[1:5, 2:9:2], base[2, 3:].unsqueeze(0).expand(4, 7), base[:, ::3]]
    for t in cases:
        for dev in ("cpu", "tpu"):
            c = conformance.to_device(t, dev)
            assert c.device.type == dev
            assert (c.shape, c.stride(), c.storage_offset()) == \
                (t.shape, t.stride(), t.storage_offset()), (dev, t.stride())
            torch.testing.assert_close(c.cpu(), t, atol=0, rtol=0)
    inp, args, _ = conformance.copy_args(FakeOp(torch.add), SampleInput(cases[1], args=(cases[3],)), "tpu")
    assert inp.stride() == cases[1].stride() and args[0].stride() == cases[3].stride()
    assert not inp.is_contiguous() and inp.storage_offset() == 12


def test_grads_of_non_contiguous_leaves_reach_them():
    t = torch.randn(4, 6)[:, ::2].requires_grad_()
    op = FakeOp(lambda x: (x * x).sum(), "fake_square")
    out, grads_of = conformance.call(op, SampleInput(t), "tpu")
    out.backward()
    (leaf,) = grads_of
    assert leaf.stride() == t.stride()
    torch.testing.assert_close(leaf.grad.cpu(), 2 * t.detach(), atol=1e-6, rtol=1e-6)


def test_every_reference_input_runs_by_default():
    op = conformance.op_db()["add"]
    n = sum(1 for _ in op.reference_inputs("cpu", torch.float32, requires_grad=True))
    assert n > 8
    rec = conformance.run_entry(op, ("float32",))["float32"]["fwd"]
    assert sum(rec["samples"].values()) == n, rec
    assert rec["status"] == "native" and rec["verified"] == "values"
    capped = conformance.run_entry(op, ("float32",), max_samples=2)["float32"]["fwd"]
    assert sum(capped["samples"].values()) == 2


def test_outputs_are_compared_structurally():
    op = conformance.op_db()["add"]
    a = torch.ones(2)
    with pytest.raises(AssertionError, match="structure"):
        conformance.compare((a, a), [a, a], op, torch.float32)  # tuple vs list
    with pytest.raises(AssertionError, match="structure"):
        conformance.compare((a, (a,)), (a, a), op, torch.float32)  # nesting
    with pytest.raises(AssertionError, match=r"torch.float64\[2\] on tpu, torch.float32\[2\] on CPU"):
        conformance.compare(a.double(), a, op, torch.float32)
    with pytest.raises(AssertionError, match=r"int on tpu, float on CPU"):
        conformance.compare((a, 1), (a, 1.0), op, torch.float32)
    with pytest.raises(AssertionError, match="output 1 of 2"):
        conformance.compare((a, a + 1), (a, a), op, torch.float32)
    mm = torch.return_types.max((a, torch.zeros(2, dtype=torch.long)))
    conformance.compare(mm, torch.return_types.max((a, torch.zeros(2, dtype=torch.long))), op,
                        torch.float32)


def test_error_inputs_must_raise_the_type_cpu_raises():
    x = torch.ones(3)

    def picky(t):  # RuntimeError on CPU, ValueError on tpu
        raise (RuntimeError if t.device.type == "cpu" else ValueError)("bad input")
    assert conformance.error_input_parity(FakeOp(picky), SampleInput(x)) == (
        "mismatch", "tpu raised ValueError: bad input; CPU raised RuntimeError: bad input")

    def cpu_only(t):
        if t.device.type == "cpu":
            raise IndexError("target 7 is out of bounds")
        return t + 1
    status, why = conformance.error_input_parity(FakeOp(cpu_only), SampleInput(x))
    assert status == "mismatch" and why.startswith("tpu did not raise; CPU raised IndexError")
    assert conformance.error_input_parity(FakeOp(lambda t: t + 1), SampleInput(x))[0] == "skipped"
    # A real entry: the index ops' out-of-range and wrong-dtype inputs raise alike.
    errs = conformance.run_error_inputs(conformance.op_db()["gather"])
    assert errs["status"] == "match" and errs["samples"]["match"] >= 3, errs


def test_error_input_parity_is_summarized_and_guarded():
    entries = {"a": {"error_inputs": {"raise": {"status": "match", "samples": {"match": 3}}}},
               "b": {"error_inputs": {"raise": {"status": "mismatch",
                                                "samples": {"match": 1, "mismatch": 1}}}}}
    for e in entries.values():
        e["float32"] = {"fwd": {"status": "native", "verified": "values"}}
    s = conformance.summarize(entries, 1.0)["error_inputs"]
    assert (s["entries"], s["match"], s["mismatch"], s["match_pct"]) == (2, 1, 1, 50.0)
    assert (s["inputs_match"], s["inputs_mismatch"], s["inputs_match_pct"]) == (4, 1, 80.0)
    now = {"a": {"error_inputs": {"raise": {"status": "mismatch"}}}}
    assert conformance.regressions({"entries": {"a": {"error_inputs": {"raise": {"status": "match"}}}}},
                                   now) == ["a error_inputs raise: was match, now mismatch"]


def test_goodness_of_fit_tests_reject_the_wrong_law():
    assert conformance_random.chi2_sf(3.841, 1) == pytest.approx(0.05, abs=1e-3)
    assert conformance_random.chi2_sf(18.307, 10) == pytest.approx(0.05, abs=1e-3)
    assert conformance_random.kolmogorov_sf(1.358) == pytest.approx(0.05, abs=1e-3)
    g = torch.Generator().manual_seed(0)
    u = torch.rand(20000, generator=g)
    assert conformance_random.ks(u, conformance_random.uniform_cdf(0, 1), "U")["ok"]
    assert not conformance_random.ks(u, conformance_random.normal_cdf(), "N")["ok"]
    assert not conformance_random.ks(u * 0.98, conformance_random.uniform_cdf(0, 1), "U")["ok"]
    assert not conformance_random.discrete_uniform(torch.randint(3, 9, (20000,), generator=g), 3, 10, "")["ok"]
    assert not conformance_random.binomial_fraction(6400, 20000, 0.3, "")["ok"]  # 32 % vs 30 %


@pytest.mark.parametrize("key", sorted(conformance_random.CHECKS))
def test_random_op_follows_its_documented_law_on_tpu(key):
    res = conformance_random.check(key, "tpu")
    assert res["ok"], res
    assert res["p"] >= conformance_random.ALPHA and res["n"] >= 5000
    assert not math.isnan(res["statistic"])


def test_random_ops_are_reported_apart_and_failed_by_a_wrong_law(monkeypatch):
    res = conformance.run(["rand_like", "empty_like", "add"], ("float32",), max_samples=2, jobs=0,
                          progress=False)
    e = res["entries"]
    rec = e["rand_like"]["float32"]["fwd"]
    assert rec["status"] == "native" and rec["verified"] == "distribution" and rec["random"] == "drawn"
    assert rec["distribution"]["test"] == "KS" and rec["distribution"]["ok"]
    empty = e["empty_like"]["float32"]["fwd"]
    assert empty["verified"] == "shape" and empty["random"] == "uninitialized"
    s = res["summary"]["fwd"]
    assert (s["random"], s["random_distribution_pass"], s["random_shape_only"]) == (2, 1, 1)
    assert s["value_verified_native"] == 1 and s["value_verified_native_pct"] == pytest.approx(33.3)
    # A law the op does not follow makes it a mismatch.
    monkeypatch.setitem(conformance_random.CHECKS, "rand_like", lambda dev: conformance_random.ks(
        torch.rand(20000, device=dev), conformance_random.uniform_cdf(0.0, 0.9), "U(0, 0.9)"))
    bad = conformance.run_entry(conformance.op_db()["rand_like"], ("float32",), max_samples=1)
    rec = bad["float32"]["fwd"]
    assert rec["status"] == "mismatch" and rec["verified"] == "none"
    assert re.fullmatch(r"distribution: KS p=\S+ against U\(0, 0.9\)", rec["message"]), rec["message"]
    assert rec["distribution"]["p"] < conformance_random.ALPHA


def test_resume_reuses_finished_entries_with_the_same_settings(monkeypatch, tmp_path):
    ran = []

    def fake_entry(entry, dtypes, max_samples):
        ran.append((entry.name, dtypes, max_samples))
        return {"float32": {"fwd": {"status": "native", "verified": "values"}}}

    monkeypatch.setattr(conformance, "run_entry", fake_entry)
    out = str(tmp_path)
    conformance.run(["abs"], ("float32",), 2, jobs=0, out=out, progress=False)
    res = conformance.run(["abs", "neg"], ("float32",), 2, jobs=0, out=out, progress=False,
                          resume=True)
    assert [r[0] for r in ran] == ["abs", "neg"]  # abs came from the log the second time
    assert res["meta"]["resumed_entries"] == 1 and set(res["entries"]) == {"abs", "neg"}
    # Other settings (here the sample count) are not taken from the log.
    conformance.run(["abs"], ("float32",), 3, jobs=0, out=out, progress=False, resume=True)
    assert [r[0] for r in ran] == ["abs", "neg", "abs"]
    # Without --resume everything runs again.
    conformance.run(["abs"], ("float32",), 2, jobs=0, out=out, progress=False)
    assert len(ran) == 4


class FakeOpInfo(FakeOp):
    decorators = ()


def test_float32_miss_passes_only_when_as_close_to_float64_as_cpu():
    op = FakeOpInfo(torch.neg)
    ref = torch.linspace(-1, 1, 9, dtype=torch.float64)
    tol = 1e-4 + 1e-4 * ref.abs()  # the default float32 tolerance, per element
    want = (ref + 3 * tol).float()  # CPU's float32: 3 tolerances from the float64 result
    conformance.close_to_float64((ref + 5 * tol).float(), want, ref, op)  # 5 <= 2 x 3
    with pytest.raises(AssertionError, match="tolerances from the float64 result"):
        conformance.close_to_float64((ref + 7 * tol).float(), want, ref, op)
    # Within the tolerance of the float64 result passes whatever CPU's error.
    conformance.close_to_float64((ref + 0.5 * tol).float(), ref.float(), ref, op)
    bad = want.clone()
    bad[2] = float("nan")
    with pytest.raises(AssertionError, match="non-finite"):
        conformance.close_to_float64(bad, want, ref, op)
    # Non-float outputs still have to equal CPU's.
    with pytest.raises(AssertionError):
        conformance.close_to_float64((want, torch.tensor([1, 2])), (want, torch.tensor([1, 3])),
                                     (ref, torch.tensor([1, 3])), op)


def test_float64_reference_runs_the_op_in_float64_with_grads():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    out, grads = conformance.float64_run(FakeOpInfo(lambda t, dtype: (t * t).sum(dtype=dtype)),
                                         SampleInput(x, kwargs={"dtype": torch.float32}), backward=True)
    assert out.dtype == torch.float64 and out.item() == 30.0
    assert grads[0].dtype == torch.float64 and torch.equal(grads[0], 2 * x.detach().double())


def test_ill_conditioned_entry_is_judged_against_float64():
    # matrix_exp's float32 result on CPU is 3.1 tolerances from float64 on some CPUs and
    # within tolerance on others (its kernels follow the instruction set). So CPU's float32
    # error is made 3 tolerances here on every CPU: tpu and CPU then miss each other by more
    # than the tolerance, and tpu, within tolerance of float64, must pass as F64_VERIFIED.
    import copy
    base = conformance.op_db()["matrix_exp"]
    atol, rtol = conformance.tolerance(base, torch.float32, torch.float32)

    def off_on_cpu(x, *args, **kwargs):
        out = base.op(x, *args, **kwargs)
        if out.device.type == "cpu" and out.dtype == torch.float32:
            out = out + (3 * (atol + rtol * out.abs())).detach()
        return out
    op = copy.copy(base)
    op.op = off_on_cpu
    rec = conformance.run_entry(op, ("float32",))["float32"]
    assert rec["fwd"]["status"] == "native" and rec["fwd"]["verified"] == "values"
    assert rec["fwd"]["message"] == conformance.F64_VERIFIED
    assert rec["bwd"]["status"] == "native"


def test_compiled_sample_that_compiles_no_graph_is_an_eager_fallback():
    # nonzero's output shape depends on its values: Dynamo hands the backend no graph and
    # the sample runs eagerly, which must not count as compiled mode working.
    import torch.testing._internal.common_methods_invocations as cmi
    seed_wrapper = cmi.wrapper_set_seed
    res = conformance.run(["nonzero", "abs"], ("float32",), max_samples=1, jobs=0,
                          progress=False, compiled=True)["entries"]
    fwd = res["nonzero"]["float32"]["fwd"]
    assert fwd["status"] == "fallback", fwd
    assert fwd["fallback_ops"] == [conformance.EAGER_IN_COMPILED]
    for d in ("fwd", "bwd"):
        assert res["abs"]["float32"][d]["status"] == "native", res["abs"]
    # The mode lasts for the run only: later eager checks in this process stay eager.
    assert conformance.COMPILED is False and cmi.wrapper_set_seed is seed_wrapper
