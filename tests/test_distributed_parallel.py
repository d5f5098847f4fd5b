"""Model parallelism on tpu over tpu_dist with unchanged PyTorch code: tensor parallel
(`parallelize_module` on an MLP and on an attention block's heads), pipeline parallel (`torch.distributed.pipelining`, GPipe and
1F1B: each rank runs a different program) and distributed checkpoints (save with 2
ranks, load with 2 and with 1). Each trains or restores against a single-process CPU
reference. Run as a script, this file is a rank process (see test_distributed.py)."""
import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import launch, assert_check, rank_main  # noqa: E402

HERE = os.path.abspath(__file__)
SUITES = {"tp": [], "pp": [], "dcp_save": [], "dcp_load": [], "agree": []}
LAUNCHES = {"tp": [("strict", "tp"), ("fused", "tp")], "pp": [("strict", "pp"), ("fused", "pp")],
            "agree": [("strict", "agree"), ("fused", "agree")],
            "dcp_save": [("strict", "dcp_save")], "dcp_load": [("strict", "dcp_load")],
            "dcp_save_fused": [("fused", "dcp_save")], "dcp_load_fused": [("fused", "dcp_load")]}
STEPS, BATCH, LR, D = 5, 8, 0.1, 8


def _data():
    import torch
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, D, generator=g), torch.randn(BATCH, D, generator=g)


def _mlp():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.Tanh(), torch.nn.Linear(4 * D, D))


def _attention_block():
    """Attention (4 heads of D // 4, causal) and an MLP, each with a residual: written as
    a model meant for tensor parallelism is, its head count read from the local width."""
    import torch
    import torch.nn.functional as F

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (torch.nn.Linear(D, D) for _ in range(4))
            self.fc, self.out = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

        def forward(self, x):  # x: (batch, seq, D)
            b, t, _ = x.shape
            q, k, v = (m(x).view(b, t, -1, D // 4).transpose(1, 2) for m in (self.q, self.k, self.v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
            return x + self.out(torch.tanh(self.fc(x)))

    torch.manual_seed(0)
    return Block()


def _sequences():
    import torch
    g = torch.Generator().manual_seed(2)
    return torch.randn(BATCH // 2, 4, D, generator=g), torch.randn(BATCH // 2, 4, D, generator=g)


def _sgd(model, x, y):
    """STEPS of SGD on (x, y); the loss of each step."""
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _reference(make=_mlp, data=_data):
    """Losses and final parameters of one CPU process training the whole model."""
    model = make()
    losses = _sgd(model, *data())
    return losses, [p.detach() for p in model.parameters()]


def _close(losses, params, make=_mlp, data=_data):
    import torch
    ref_losses, ref_params = _reference(make, data)
    assert len(losses) == STEPS
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (losses, ref_losses)
    for p, q in zip(params, ref_params):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5)


def tensor_parallel_mlp_matches_one_process(rank, world):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("tpu", (world,))
    model = parallelize_module(_mlp().to("tpu"), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    w = model[0].weight
    assert w.device.type == "tpu" and w.to_local().shape == (4 * D // world, D)
    losses = _sgd(model, *(t.to("tpu") for t in _data()))
    _close(losses, [p.full_tensor().detach().cpu() for p in model.parameters()])


def tensor_parallel_attention_matches_one_process(rank, world):
    # Megatron's split: q, k, v by output features (each rank its heads), o by input
    # features (partial sums all-reduced); the MLP likewise.
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("tpu", (world,))
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
            "fc": ColwiseParallel(), "out": RowwiseParallel()}
    model = parallelize_module(_attention_block().to("tpu"), mesh, plan)
    assert model.q.weight.to_local().shape == (D // world, D) and model.o.weight.to_local().shape == (D, D // world)
    losses = _sgd(model, *(t.to("tpu") for t in _sequences()))
    _close(losses, [p.full_tensor().detach().cpu() for p in model.parameters()], _attention_block, _sequences)


SUITES["tp"] += [tensor_parallel_mlp_matches_one_process, tensor_parallel_attention_matches_one_process]


def _pipeline(rank, world, schedule_cls):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    assert world == 2
    full = _mlp()
    stage_mod = (full[0:2] if rank == 0 else full[2:3]).to("tpu")   # each rank: its own program
    stage = PipelineStage(stage_mod, rank, world, torch.device("tpu", 0))
    loss_fn = lambda out, target: torch.nn.functional.mse_loss(out, target)  # noqa: E731
    sched = schedule_cls(stage, n_microbatches=2, loss_fn=loss_fn)
    x, y = (t.to("tpu") for t in _data())
    opt = torch.optim.SGD(stage_mod.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        if rank == 0:
            sched.step(x)
            step_loss = torch.zeros(1)
        else:
            mb_losses = []
            sched.step(target=y, losses=mb_losses)
            step_loss = torch.stack([m.detach() for m in mb_losses]).mean().cpu().reshape(1)
        opt.step()
        dist.broadcast(step_loss, src=1)   # a cpu tensor: Gloo
        losses.append(step_loss.item())
    # Both stages' parameters, gathered on every rank (cpu tensors over Gloo).
    mine = [p.detach().cpu() for p in stage_mod.parameters()]
    both = [None, None]
    dist.all_gather_object(both, mine)
    _close(losses, both[0] + both[1])


def pipeline_gpipe_matches_one_process(rank, world):
    from torch.distributed.pipelining import ScheduleGPipe
    _pipeline(rank, world, ScheduleGPipe)


def pipeline_1f1b_matches_one_process(rank, world):
    from torch.distributed.pipelining import Schedule1F1B
    _pipeline(rank, world, Schedule1F1B)


SUITES["pp"] += [pipeline_gpipe_matches_one_process, pipeline_1f1b_matches_one_process]


def _sharded_mlp():
    from torch.distributed.fsdp import fully_shard
    model = _mlp().to("tpu")
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    return model


def dcp_saves_a_sharded_model(rank, world):
    import torch
    import torch.distributed.checkpoint as dcp
    model = _sharded_mlp()
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.to_local().add_(i + 1)       # values the reference can name
    dcp.save({"model": model.state_dict()}, checkpoint_id=os.environ["TPU_DCP_DIR"])


def _saved_values():
    import torch
    with torch.no_grad():
        return {k: v + (i + 1) for i, (k, v) in enumerate(_mlp().state_dict().items())}


def dcp_loads_into_as_many_ranks(rank, world):
    import torch
    import torch.distributed.checkpoint as dcp
    if world == 1:
        model = _mlp().to("tpu")
        for p in model.parameters():
            torch.nn.init.zeros_(p)
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=os.environ["TPU_DCP_DIR"])
        got = {k: v.cpu() for k, v in model.state_dict().items()}
    else:
        model = _sharded_mlp()
        with torch.no_grad():
            for p in model.parameters():
                p.to_local().zero_()
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=os.environ["TPU_DCP_DIR"])
        model.load_state_dict(state["model"])
        got = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
    want = _saved_values()
    assert set(got) == set(want)
    for k in want:
        assert got[k].device.type == "cpu"
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)


SUITES["dcp_save"].append(dcp_saves_a_sharded_model)
SUITES["dcp_load"].append(dcp_loads_into_as_many_ranks)


def ranks_that_disagree_get_an_error_and_keep_going(rank, world):
    import re
    import torch
    import torch.distributed as dist
    keep = torch.arange(4.0, device="tpu")
    shapes = (torch.ones(4 if rank == 0 else 6, device="tpu"),
              torch.ones(4, device="tpu", dtype=torch.float32 if rank == 0 else torch.int32))
    for t in shapes:
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            msg = str(e)
            assert "mismatch between collectives" in msg and "ALLREDUCE" in msg, msg
            assert re.search(r"TensorShape=\[(4|6)\]", msg), msg
        else:
            raise AssertionError("a mismatched all_reduce passed")
    ok = torch.full((3,), float(rank + 1), device="tpu")
    dist.all_reduce(ok)                       # the group still works
    assert ok.cpu().tolist() == [3.0] * 3
    assert keep.sum().item() == 6.0           # and so do this rank's tensors


SUITES["agree"].append(ranks_that_disagree_get_an_error_and_keep_going)


if __name__ == "__main__":
    rank_main(SUITES, LAUNCHES, sys.argv)


@pytest.fixture(scope="module")
def tensor_parallel():
    return launch("tp", 2, script=HERE)


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("name", ["tensor_parallel_mlp_matches_one_process",
                                  "tensor_parallel_attention_matches_one_process"])
def test_tensor_parallel(tensor_parallel, mode, name):
    assert_check(tensor_parallel, f"{mode}/{name}")


@pytest.fixture(scope="module")
def pipelined():
    return launch("pp", 2, script=HERE)


@pytest.mark.parametrize("name", ["pipeline_gpipe_matches_one_process",
                                  "pipeline_1f1b_matches_one_process"])
@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_pipeline_parallel(pipelined, name, mode):
    assert_check(pipelined, f"{mode}/{name}")


@pytest.mark.parametrize("env", [{"TPU_DIST_CHECKS": "1"}, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}])
def test_ranks_that_disagree_get_an_error_and_keep_going(env):
    # TPU_DIST_CHECKS=1: tpu_dist wraps itself in c10d's ProcessGroupWrapper; with
    # TORCH_DISTRIBUTED_DEBUG=DETAIL PyTorch does (it needs our sequence numbers).
    res = launch("agree", 2, env=env, script=HERE)
    for mode in ("strict", "fused"):
        assert_check(res, f"{mode}/ranks_that_disagree_get_an_error_and_keep_going")


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_distributed_checkpoint_round_trip_and_resharding(mode):
    suffix = "" if mode == "strict" else "_fused"
    with tempfile.TemporaryDirectory() as d:
        env = {"TPU_DCP_DIR": d}
        assert_check(launch("dcp_save" + suffix, 2, env=env, script=HERE), f"{mode}/dcp_saves_a_sharded_model")
        assert_check(launch("dcp_load" + suffix, 2, env=env, script=HERE), f"{mode}/dcp_loads_into_as_many_ranks")
        assert_check(launch("dcp_load" + suffix, 1, env=env, script=HERE), f"{mode}/dcp_loads_into_as_many_ranks")
