"""Strict's per-op host path keeps shortcuts that must never return stale results: the
cache of scalar operands (a Python number or alpha uploaded once, remembered by each
plan and shared by all), each
executable's output types read once from its first launch, and the pending-launch list
that is scanned less often while launches run ahead of the device."""
import threading

import torch

import torch_tpu
from conftest import run_python_json


def _scalar_ops(dev):
    x = torch.arange(6, dtype=torch.float32, device=dev) / 3 - 1
    i = torch.arange(6, dtype=torch.int64, device=dev)
    b = torch.tensor([True, False, True, False, True, True], device=dev)
    out = []
    # Values share a plan's memo, bit patterns and dtypes: int 1 and float
    # 1.0, 0 and False, and alphas that alternate with the Python number on the same op.
    for v in [0, 1, 2, 3, 4, 5, 6, 7, 8, 1, 0, -1, 2**40, 1.0, 0.5, -0.0, 1e-30, 3.25, 1, 2]:
        out.append(x + v)
        out.append(x.add(x, alpha=v))
        out.append(i * int(v))
        out.append(i.add(i, alpha=int(v)))
        out.append(b & bool(v))
        out.append(torch.full_like(x, 7.0).sub(x, alpha=v))
    return out


def _check_scalar_ops():
    for got, want in zip(_scalar_ops("tpu"), _scalar_ops("cpu")):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_scalar_operands_never_reuse_another_value():
    _check_scalar_ops()
    _check_scalar_ops()  # warm: every plan and scalar buffer cached


def test_scalar_operands_on_another_thread():
    _check_scalar_ops()
    errors = []

    def work():
        try:
            _check_scalar_ops()
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_threads_passing_different_numbers_to_one_plan_each_get_their_own():
    # Every thread's `x + v` and `x.add(x, alpha=v)` share two plans, and so their memos.
    x = torch.arange(4, dtype=torch.float32, device="tpu")
    errors = []

    def work(v):
        try:
            for _ in range(200):
                got = (x + v).add(x, alpha=v).cpu()
                want = torch.arange(4, dtype=torch.float32) * (1 + v) + v
                assert torch.equal(got, want), (v, got, want)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(v,)) for v in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_outputs_of_one_executable_keep_their_types():
    x = torch.randn(4, 5)
    xt = x.to("tpu")
    for _ in range(3):  # the first launch reads the types, the others reuse them
        v, ix = xt.max(dim=1)
        var, mean = torch.var_mean(xt, dim=0)
        want_v, want_ix = x.max(dim=1)
        assert (v.dtype, ix.dtype, tuple(v.shape), tuple(ix.shape)) == (torch.float32, torch.int64, (4,), (4,))
        assert (var.dtype, tuple(var.shape), tuple(mean.shape)) == (torch.float32, (5,), (5,))
        torch.testing.assert_close(v.cpu(), want_v)
        assert torch.equal(ix.cpu(), want_ix)
        want_var, want_mean = torch.var_mean(x, dim=0)
        torch.testing.assert_close(var.cpu(), want_var)
        torch.testing.assert_close(mean.cpu(), want_mean)


def test_a_reloaded_executable_reads_its_types_again(tmp_path):
    # A bound of 2 loaded programs: each op's executable is dropped and reloaded (a new
    # object) between uses, and its outputs must keep their own dtypes and shapes.
    prog = (
        "import json, torch, torch_tpu\n"
        "x = torch.arange(12.0).reshape(3, 4)\n"
        "t = x.to('tpu')\n"
        "ok = True\n"
        "for _ in range(3):\n"
        "    for f in (lambda a: a.max(dim=0), lambda a: a.sum(1), lambda a: a.argmin(1),\n"
        "              lambda a: (a > 5), lambda a: a.t() * 2):\n"
        "        got, want = f(t), f(x)\n"
        "        got = got if isinstance(got, tuple) else (got,)\n"
        "        want = want if isinstance(want, tuple) else (want,)\n"
        "        for g, w in zip(got, want):\n"
        "            ok = ok and g.dtype == w.dtype and g.shape == w.shape and torch.equal(g.cpu(), w)\n"
        "print(json.dumps({'ok': ok, 'unloaded': torch_tpu.metrics()['programs_unloaded']}))\n")
    out = run_python_json(prog, env={"TPU_COMPILE_CACHE_DIR": str(tmp_path), "TPU_MAX_LOADED_PROGRAMS": "2"})
    assert out["ok"]
    assert out["unloaded"] >= 10


def test_a_long_chain_without_sync_completes_and_syncs():
    # Far more launches than the pending-event list's first scan point (256).
    x0 = torch.zeros(16, device="tpu")
    x = x0
    for _ in range(3000):
        x = x + 1
    torch.tpu.synchronize()
    assert torch.equal(x.cpu(), torch.full((16,), 3000.0))
    y = x0
    for _ in range(700):
        y = y * 1 + 2
    assert y[0].item() == 1400.0
    torch.tpu.synchronize()
    assert torch_tpu.metrics()["executions"] > 0


def test_dispatch_floor_probe_hands_back_the_argument_and_records_nothing():
    # The benchmarks' floor of recording: with the probe on, `x + 1` reaches our kernel
    # and returns a new tensor over x's storage, untouched (no op counted); off again,
    # ops compute as before.
    x = torch.arange(4.0, device="tpu")
    before = torch_tpu.metrics()["op_calls"]
    torch_tpu._C._set_dispatch_floor_probe(1)
    try:
        y = x + 1
    finally:
        torch_tpu._C._set_dispatch_floor_probe(0)
    assert torch_tpu.metrics()["op_calls"] == before
    assert y is not x and y.data_ptr() == x.data_ptr() and y.shape == x.shape
    assert torch.equal((x + 1).cpu(), torch.arange(1.0, 5.0))


def test_launching_floor_probe_makes_one_chained_launch_per_call():
    # Strict's floor in place: as above, and each call also launches the runtime's own
    # `x + 1` on the previous launch's output (its chain counts the calls), outside our
    # kernel (no op counted) and leaving the user's tensors as they were.
    x = torch.arange(4.0, device="tpu")
    torch_tpu._C._set_dispatch_floor_probe(2)
    try:
        start = torch_tpu._C._wait_chain_probe()
        before = torch_tpu.metrics()
        y = x
        for _ in range(25):
            y = y + 1
        counted = torch_tpu._C._wait_chain_probe() - start
    finally:
        torch_tpu._C._set_dispatch_floor_probe(0)
    after = torch_tpu.metrics()
    assert counted == 25
    assert after["op_calls"] == before["op_calls"] and after["executions"] - before["executions"] == 25
    assert y.data_ptr() == x.data_ptr() and torch.equal(x.cpu(), torch.arange(4.0))


def test_unboxed_kernels_borrow_arguments_and_let_go_of_them():
    # Functional ops with Tensor and Scalar arguments are called unboxed: the stack
    # borrows the caller's tensors. Every way out (a result, CPU's error for bad input,
    # a boxed caller, autograd) must leave each argument's references as they were.
    import gc
    import sys
    import weakref
    for op in ("aten::add.Tensor", "aten::mul.Tensor", "aten::neg", "aten::add.Scalar"):
        kernel = [line for line in torch._C._dispatch_dump(op).splitlines() if line.startswith("PrivateUse1:")]
        assert len(kernel) == 1 and kernel[0].endswith("[ boxed unboxed ]"), (op, kernel)
    for mode in (torch_tpu.EagerMode.DEFER_NEVER, torch_tpu.EagerMode.DEFER_AND_FUSE):
        with torch_tpu.set_eager_mode(mode):
            x = torch.arange(4.0, device="tpu")
            y = torch.ones(4, device="tpu")
            bad = torch.ones(3, device="tpu")
            before = (sys.getrefcount(x), sys.getrefcount(y), sys.getrefcount(bad))
            for _ in range(200):
                z = x.add(y, alpha=2)        # Tensor, Tensor, Scalar
                w = torch.mul(x, y).neg()    # Tensor, Tensor; Tensor
                v = torch.ops.aten.add.Scalar(x, 3, 2)  # a boxed caller: Tensor, Scalar, Scalar
                try:
                    x + bad                  # CPU's error, raised through the fallback path
                except RuntimeError as e:
                    assert "size of tensor a (4) must match the size of tensor b (3)" in str(e)
                else:
                    raise AssertionError("mismatched shapes were accepted")
            assert (sys.getrefcount(x), sys.getrefcount(y), sys.getrefcount(bad)) == before
            assert torch.equal(z.cpu(), torch.tensor([2.0, 3, 4, 5]))
            assert torch.equal(w.cpu(), -torch.arange(4.0))
            assert torch.equal(v.cpu(), torch.arange(4.0) + 6)
            # The arguments stay usable, and go when their last reference does.
            assert torch.equal((x * 2).cpu(), torch.arange(4.0) * 2)
            gone = weakref.ref(x)
            del x, z, w, v
            gc.collect()
            assert gone() is None
    # Autograd through unboxed kernels: gradients as on CPU.
    a = torch.tensor([1.0, -2.0, 3.0], device="tpu", requires_grad=True)
    b = torch.tensor([0.5, 4.0, -1.0], device="tpu", requires_grad=True)
    (a.mul(b).add(a, alpha=3).exp().sum()).backward()
    ac = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    bc = torch.tensor([0.5, 4.0, -1.0], requires_grad=True)
    (ac.mul(bc).add(ac, alpha=3).exp().sum()).backward()
    assert torch.allclose(a.grad.cpu(), ac.grad, rtol=1e-5) and torch.allclose(b.grad.cpu(), bc.grad, rtol=1e-5)


def test_launch_trace_replays_a_step_without_touching_its_tensors():
    # The benchmarks' Strict floor: a traced sequence of launches is run again by the
    # runtime alone. The replay launches what was traced, in order, no more, and leaves
    # the user's tensors as they were.
    with torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_NEVER):
        x = torch.arange(8.0, device="tpu")
        w = torch.full((8,), 2.0, device="tpu")
        torch.tpu.synchronize()
        torch_tpu._C._start_launch_trace()
        y = (x * w + 1).relu() - x
        s = y.sum()
        torch.tpu.synchronize()
        n = torch_tpu._C._stop_launch_trace()
        try:
            assert n == 5  # mul, add, relu, sub, sum
            before = torch_tpu.metrics()["executions"]
            seconds = torch_tpu._C._replay_launch_trace(2)
            each = torch_tpu._C._replay_launch_trace_each(1)
            # One warm-up and `repeats` timed replays of the 5 launches, each time.
            assert torch_tpu.metrics()["executions"] - before == 5 * 3 + 5 * 2
        finally:
            torch_tpu._C._drop_launch_trace()
        assert seconds > 0 and len(each) == 5 and all(t > 0 for _, t in each)
        # A program is named after the first op that compiled it, and the overloads of an
        # op (`add_`, `add.Tensor`, `mul.out`) share one, so an earlier test in this process
        # may have named it after another overload: compare the ops, not the overloads.
        names = [name.split("(")[0].split(".")[0].rstrip("_") for name, _ in each]
        assert names == ["aten::mul", "aten::add", "aten::relu", "aten::sub", "aten::sum"]
        assert torch.equal(y.cpu(), torch.arange(8.0) + 1) and s.item() == 36.0
        assert torch.equal(x.cpu(), torch.arange(8.0))
        # Tracing is off once stopped: later launches are not kept.
        assert torch_tpu._C._stop_launch_trace() == 0


def test_an_alpha_of_one_is_no_operand_of_the_program():
    # add/sub/rsub with alpha 1 (every `x + y`) launch a program without the alpha
    # operand; any other alpha is still read at run time, from a plan of its own.
    with torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_NEVER):
        x = torch.arange(8.0, device="tpu")
        i = torch.arange(8, device="tpu")

        def ops():
            return [x + 1, x.add(x, alpha=2), x - x, x.sub(x, alpha=1.0), torch.rsub(x, 2), i.add(i, alpha=3),
                    i + i, x.add(x, alpha=1)]

        ops()  # compiled: a program compiling ahead would launch out of call order
        torch.tpu.synchronize()
        torch_tpu._C._start_launch_trace()
        got = ops()
        torch.tpu.synchronize()
        assert torch_tpu._C._stop_launch_trace() == len(got)
        try:
            counts = torch_tpu._C._launch_trace_operand_counts()
        finally:
            torch_tpu._C._drop_launch_trace()
    assert counts == [2, 3, 2, 2, 2, 3, 2, 2]
    xc, ic = torch.arange(8.0), torch.arange(8)
    want = [xc + 1, xc.add(xc, alpha=2), xc - xc, xc.sub(xc, alpha=1.0), torch.rsub(xc, 2), ic.add(ic, alpha=3),
            ic + ic, xc.add(xc, alpha=1)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)
