"""A model made on the device trains with the programs of its first step from then on.

Made under `with torch.device("tpu")`, a zero-initialized parameter (`nn.init.zeros_`)
or buffer (a BatchNorm's running mean) is a storage never written, which an op read as
zeros baked into its program; the next step read the written storage: its forward,
backward and BatchNorm update compiled again at step 1 (Strict, Debug). In DeferAndFuse
the model's initialization (its random and zero fills, pending) joined the first step's
graph, so the second step's graph was another compile. Now a module's parameters and
buffers get their zeros before an op reads them, and making an optimizer cuts the
pending graph (the initialization runs on its own)."""
import copy

import pytest
import torch
import torch.nn as nn

import torch_tpu
from torch_tpu import EagerMode

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING, EagerMode.DEFER_AND_FUSE]


@pytest.fixture(params=MODES, ids=["strict", "debug", "fused"])
def mode(request):
    with torch_tpu.set_eager_mode(request.param):
        yield request.param


def compiles():
    m = torch_tpu.metrics()
    return m["op_compiles"] + m["graph_compiles"]


def zero_init_mlp(width):
    m = nn.Sequential(nn.Linear(7, width), nn.ReLU(), nn.Linear(width, 3))
    nn.init.zeros_(m[0].bias)
    nn.init.zeros_(m[2].weight)
    return m


def conv_bn(channels):
    return nn.Sequential(nn.Conv2d(3, channels, 3), nn.BatchNorm2d(channels), nn.ReLU())


MODELS = {"zero_init_mlp": (zero_init_mlp, (5, 7)), "conv_bn": (conv_bn, (4, 3, 9, 9))}


def train(model, x, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    counts, losses = [], []
    for _ in range(steps):
        c0 = compiles()
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        counts.append(compiles() - c0)
    return counts, losses


@pytest.mark.parametrize("name", MODELS)
def test_a_model_made_on_the_device_compiles_nothing_after_its_first_step(mode, name):
    make, shape = MODELS[name]
    width = 13 + 2 * MODES.index(mode) + (0 if name == "zero_init_mlp" else 1)  # own shapes per test
    torch.manual_seed(0)
    with torch.device("tpu"):
        model = make(width)
    x = torch.randn(*shape[:1], *((shape[1], width // 2 + 5, width // 2 + 5) if len(shape) == 4 else shape[1:]))
    trains_as_on_cpu_without_recompiling(model, make(width), x)


def trains_as_on_cpu_without_recompiling(model, ref, x):
    """Trains `model` (tpu) 4 steps: nothing compiles after step 0, and losses and state
    equal those of `ref` (the same module on the CPU) trained from the same values."""
    initial = copy.deepcopy(model)  # (read after training: reading now would run what is pending)
    counts, losses = train(model, x.to("tpu"), 4)
    assert counts[1:] == [0, 0, 0], counts
    ref.load_state_dict({k: v.cpu() for k, v in initial.state_dict().items()})
    _, want = train(ref, x, 4)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(want), rtol=1e-5, atol=1e-6)
    for (k, got), (_, exp) in zip(model.state_dict().items(), ref.state_dict().items()):
        torch.testing.assert_close(got.cpu(), exp, rtol=1e-5, atol=1e-6, msg=k)


def test_a_model_made_on_meta_then_to_empty_compiles_nothing_after_its_first_step(mode):
    # The meta-device flow (FSDP2's): to_empty makes fresh, unwritten tensors, then
    # reset_parameters initializes them (zeros for biases and running statistics).
    width = 23 + 2 * MODES.index(mode)
    with torch.device("meta"):
        model = conv_bn(width)
    model.to_empty(device="tpu")
    torch.manual_seed(0)
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    trains_as_on_cpu_without_recompiling(model, conv_bn(width), torch.randn(3, 3, 8, 8))


def test_a_zero_initialized_parameter_reads_as_zeros(mode):
    with torch.device("tpu"):
        lin = nn.Linear(4, 6)
        nn.init.zeros_(lin.weight)
        nn.init.zeros_(lin.bias)
    x = torch.randn(3, 4, device="tpu")
    assert torch.equal(lin(x).cpu(), torch.zeros(3, 6))
    assert torch.equal(lin.weight.cpu(), torch.zeros(6, 4))


def test_making_an_optimizer_runs_the_models_initialization_in_defer_and_fuse():
    with torch_tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE):
        with torch.device("tpu"):
            model = nn.Linear(5, 31)  # its fills are recorded, pending
        f0 = flushes("optimizer made")
        torch.optim.Adam(model.parameters())
        assert flushes("optimizer made") == f0 + 1
        torch.optim.Adam(model.parameters())  # nothing pending: nothing to run
        assert flushes("optimizer made") == f0 + 1


def flushes(reason):
    return torch_tpu.metrics()["flushes"].get(reason, 0)


def test_a_buffer_assigned_in_a_compiled_forward_breaks_no_graph():
    # Marking module state is host bookkeeping that Dynamo cannot trace: a buffer assigned
    # in forward (self.n = self.n + 1) broke the graph at every call (fullgraph=True raised).
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(()))

        def forward(self, a):
            self.n = self.n + 1
            return a * self.n

    dynamo.reset()
    counters.clear()
    m = Counter().to("tpu")
    f = torch.compile(m, backend="tpu", fullgraph=True)
    for _ in range(3):
        out = f(torch.ones(3, device="tpu"))
    assert out.cpu().tolist() == [3.0] * 3 and m.n.item() == 3.0
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
