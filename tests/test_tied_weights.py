"""Moving a module to tpu keeps its Parameter objects, as a move to CUDA does: weight ties,
optimizers built before the move, hooks and state dicts all see the moved parameters."""
import copy

import pytest
import torch
import torch.nn as nn

from conftest import no_fallbacks


class TiedLM(nn.Module):
    """An embedding whose weight is also the output projection's (tied, like GPT-2's)."""

    def __init__(self, vocab=11, d=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.body = nn.Linear(d, d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, idx, target):
        h = torch.tanh(self.body(self.embed(idx)))
        return nn.functional.cross_entropy(self.lm_head(h).flatten(0, 1), target.flatten())


def data(steps=3):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 11, (2, 5), generator=g), torch.randint(0, 11, (2, 5), generator=g))
            for _ in range(steps)]


def test_move_keeps_parameter_objects_and_ties():
    torch.manual_seed(0)
    m = TiedLM()
    params = list(m.parameters())
    m.to("tpu")
    assert m.lm_head.weight is m.embed.weight
    assert [p is q for p, q in zip(m.parameters(), params)] == [True] * len(params)
    assert all(p.device.type == "tpu" and isinstance(p, nn.Parameter) for p in m.parameters())
    assert len(list(m.parameters())) == 3  # the tied weight counts once
    m.to("cpu")
    assert m.lm_head.weight is m.embed.weight and m.embed.weight is params[0]
    assert m.embed.weight.device.type == "cpu"


def test_tied_gradient_matches_cpu():
    torch.manual_seed(0)
    cpu = TiedLM()
    tpu = copy.deepcopy(cpu).to("tpu")
    x, y = data(1)[0]
    with no_fallbacks():
        tpu(x.to("tpu"), y.to("tpu")).backward()
    cpu(x, y).backward()
    # The tied weight's gradient sums the embedding's and the head's contributions.
    assert tpu.embed.weight.grad is tpu.lm_head.weight.grad
    for (name, p), q in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_optimizer_built_before_the_move_updates_the_moved_parameters():
    torch.manual_seed(0)
    cpu = TiedLM()
    moved = copy.deepcopy(cpu)
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_tpu = torch.optim.AdamW(moved.parameters(), lr=1e-2)  # before .to("tpu"), as with CUDA
    moved.to("tpu")
    before = moved.embed.weight.detach().cpu().clone()
    for x, y in data():
        for model, opt, dev in ((cpu, opt_cpu, "cpu"), (moved, opt_tpu, "tpu")):
            opt.zero_grad()
            model(x.to(dev), y.to(dev)).backward()
            opt.step()
    assert not torch.equal(moved.embed.weight.detach().cpu(), before)
    for p, q in zip(cpu.parameters(), moved.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
    # The optimizer state lives beside the parameters it updates.
    assert all(s["exp_avg"].device.type == "tpu" for s in opt_tpu.state.values())


def test_hooks_and_grad_survive_the_move():
    lin = nn.Linear(3, 2)
    seen = []
    lin.weight.register_hook(lambda g: seen.append(g.device.type))
    lin.weight.grad = torch.ones(2, 3)
    lin.to("tpu")
    assert lin.weight.grad.device.type == "tpu" and lin.weight.grad.cpu().eq(1).all()
    lin.weight.grad = None
    lin(torch.randn(4, 3, device="tpu")).sum().backward()
    assert seen == ["tpu"]


def test_load_state_dict_after_the_move_keeps_ties():
    torch.manual_seed(0)
    src = TiedLM()
    m = TiedLM().to("tpu")
    m.load_state_dict(src.state_dict())
    assert m.lm_head.weight is m.embed.weight and m.embed.weight.device.type == "tpu"
    torch.testing.assert_close(m.embed.weight.detach().cpu(), src.embed.weight.detach())
    x, y = data(1)[0]
    torch.testing.assert_close(m(x.to("tpu"), y.to("tpu")).cpu(), src(x, y), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("src", ["cpu", "tpu"])
def test_to_empty_treats_ties_as_on_cpu(src):
    """From a real device the tie survives; from meta PyTorch unties on any device (meta
    tensors are not shallow-copy compatible), so tpu must do what cpu does."""
    for start in (src, "meta"):
        results = []
        for target in ("cpu", "tpu"):
            with torch.device(start):
                m = TiedLM()
            m.to_empty(device=target)
            assert m.embed.weight.device.type == target
            results.append(m.lm_head.weight is m.embed.weight)
        assert results[0] == results[1], (start, results)
        assert results[1] == (start != "meta")


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_dtype_moves_keep_identity_as_on_cpu(dtype):
    m = TiedLM().to("tpu")
    w = m.embed.weight
    m.to(dtype)
    assert m.embed.weight is w and m.lm_head.weight is w and w.dtype == dtype


def test_weight_norm_backward_is_native():
    torch.manual_seed(0)
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3), dim=2)
    lin = nn.utils.parametrizations.weight_norm(nn.Linear(5, 3))
    x1, x2 = torch.randn(2, 4, 9), torch.randn(7, 5)
    for m, x in ((conv, x1), (lin, x2)):
        t = copy.deepcopy(m).to("tpu")
        with no_fallbacks():
            t(x.to("tpu")).square().sum().backward()
        m(x).square().sum().backward()
        for (name, p), q in zip(m.named_parameters(), t.parameters()):
            torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-5, msg=name)


def test_weight_norm_interface_backward_matches_cpu():
    torch.manual_seed(0)
    for dim, shape in ((0, (6, 4, 3)), (2, (6, 4, 3)), (1, (5, 4))):
        v, g = torch.randn(shape, dtype=torch.float64), torch.randn(shape, dtype=torch.float64)
        g = g.amax(dim=[d for d in range(len(shape)) if d != dim], keepdim=True)
        w, norms = torch._weight_norm_interface(v, g, dim)
        gw = torch.randn_like(w)
        want = torch.ops.aten._weight_norm_interface_backward(gw, v, g, norms, dim)
        with no_fallbacks():
            got = torch.ops.aten._weight_norm_interface_backward(
                gw.to("tpu"), v.to("tpu"), g.to("tpu"), norms.to("tpu"), dim)
        for a, b in zip(got, want):
            torch.testing.assert_close(a.cpu(), b)


@pytest.mark.parametrize("arch", ["gpt2", "bart"])
def test_hugging_face_tied_models_get_cpu_gradients(arch):
    """Two of the architectures that trained with wrong gradients: GPT-2 ties its LM head to
    the token embedding; BART ties encoder, decoder and head embeddings to `shared`."""
    transformers = pytest.importorskip("transformers")
    sizes = (dict(n_embd=32, n_layer=2, n_head=2, n_positions=32) if arch == "gpt2" else
             dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                  max_position_embeddings=32))
    cfg = transformers.AutoConfig.for_model(arch, vocab_size=64, **sizes)
    cls = transformers.AutoModelForCausalLM if arch == "gpt2" else transformers.AutoModelForSeq2SeqLM
    torch.manual_seed(0)
    cpu = cls.from_config(cfg).eval()
    tpu = copy.deepcopy(cpu).to("tpu")
    assert tpu.get_output_embeddings().weight is tpu.get_input_embeddings().weight
    ids = torch.randint(3, 64, (2, 8))
    cpu(input_ids=ids, labels=ids).loss.backward()
    with no_fallbacks():
        tpu(input_ids=ids.to("tpu"), labels=ids.to("tpu")).loss.backward()
    for (name, p), q in zip(cpu.named_parameters(), tpu.parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=name)
