"""Hugging Face `generate()` on tpu picks the tokens CPU picks: greedy and beam search,
the dynamic and the static KV cache, left-padded batches, repetition penalties, and the
scores it returns. Models are built from small configs (no downloads)."""
import pytest
import torch

from conftest import no_fallbacks

transformers = pytest.importorskip("transformers")

# Row 1 is left-padded: its first two positions are masked out.
IDS = torch.tensor([[5, 9, 3, 7, 1, 2], [0, 0, 4, 8, 6, 11]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])


def build(arch):
    torch.manual_seed(0)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=128, n_positions=64)
        model = transformers.GPT2LMHeadModel(cfg)
    elif arch == "llama":
        cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=2, num_key_value_heads=1, vocab_size=128,
                                       max_position_embeddings=64)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16,
                                    vocab_size=128, decoder_start_token_id=0)
        model = transformers.T5ForConditionalGeneration(cfg)
    return model.eval()


def generate(arch, device, **kw):
    model = build(arch).to(device)
    with torch.no_grad():
        return model.generate(input_ids=IDS.to(device), attention_mask=MASK.to(device), pad_token_id=0,
                              max_new_tokens=8, **kw)


SETTINGS = {
    "greedy": {},
    "beam": {"num_beams": 3},
    "static_cache": {"cache_implementation": "static"},
    "penalties": {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2},
}


@pytest.mark.parametrize("arch,setting", [("gpt2", s) for s in SETTINGS] + [("llama", s) for s in SETTINGS]
                         + [("t5", "greedy"), ("t5", "beam")])
def test_generated_tokens_match_cpu(arch, setting):
    import torch_tpu  # noqa: F401
    want = generate(arch, "cpu", **SETTINGS[setting])
    with no_fallbacks():
        got = generate(arch, "tpu", **SETTINGS[setting])
    assert got.device.type == "tpu"
    # The prompt plus 8 new tokens (T5: the decoder's start token plus 8).
    assert got.shape == want.shape and want.shape[1] in (IDS.shape[1] + 8, 9)
    assert torch.equal(got.cpu(), want)


def test_returned_scores_match_cpu():
    import torch_tpu  # noqa: F401
    kw = {"output_scores": True, "return_dict_in_generate": True}
    want = generate("llama", "cpu", **kw)
    got = generate("llama", "tpu", **kw)
    assert torch.equal(got.sequences.cpu(), want.sequences)
    assert len(got.scores) == len(want.scores) == 8
    for g, w in zip(got.scores, want.scores):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-4)
