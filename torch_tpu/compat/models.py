"""Which model to build for each Hugging Face model type, a small valid config for it, and
inputs for its modality. Everything is made locally from config classes: no downloads."""
import inspect

import torch

# Task heads in the order a representative class is picked (the first mapping that has
# the model type), each with the modality family it reports under.
HEADS = [
    ("causal_lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "decoder"),
    ("seq2seq_lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "encoder-decoder"),
    ("masked_lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "encoder"),
    ("sequence_classification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "encoder"),
    ("speech_seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "audio"),
    ("ctc", "MODEL_FOR_CTC_MAPPING_NAMES", "audio"),
    ("audio_classification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "audio"),
    ("image_classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "vision"),
    ("image_text_to_text", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "multimodal"),
    ("base", "MODEL_MAPPING_NAMES", "other"),
]

# Config fields shrunk wherever they appear (sub-configs too). Head and width values keep
# head_dim = 16 and widths divisible by every head count used here.
SMALL = {
    "hidden_size": 32, "d_model": 32, "n_embd": 32, "embed_dim": 32, "dim": 32, "d_embed": 32,
    "word_embed_proj_dim": 32, "embedding_size": 32, "projection_dim": 32, "text_embed_dim": 32,
    "intermediate_size": 64, "ffn_dim": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
    "n_inner": 64, "hidden_dim": 64, "d_ff": 64, "d_inner": 64, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "encoder_layers": 1,
    "decoder_layers": 1, "num_decoder_layers": 1, "num_encoder_layers": 1,
    "num_attention_heads": 2, "n_head": 2, "n_heads": 2, "encoder_attention_heads": 2,
    "decoder_attention_heads": 2, "num_heads": 2, "num_key_value_heads": 1,
    "multi_query_group_num": 1, "head_dim": 16, "d_kv": 16, "attention_head_dim": 16,
    "vocab_size": 128, "max_position_embeddings": 64, "n_positions": 64, "n_ctx": 64,
    "max_source_positions": 32, "max_target_positions": 32,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_topk": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "image_size": 32, "patch_size": 8, "num_channels": 3, "num_mel_bins": 16,
    "conv_dim": [16, 16], "conv_stride": [5, 2], "conv_kernel": [10, 3], "num_feat_extract_layers": 2,
    "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2,
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 16, "num_labels": 3,
}
# Per-stage lists of hierarchical models (ResNet, Swin, ...): same length, small values.
STAGE_LISTS = {"depths": 1, "hidden_sizes": 16, "embed_dims": 16, "num_heads": 2}
# Float fields whose names hold one of these draw random masks when the model trains.
RANDOM_MASKS = ("dropout", "drop_", "pdrop", "layerdrop", "mask_time_prob", "mask_feature_prob")
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
             "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id")


def head_mappings():
    from transformers.models.auto import modeling_auto
    return [(name, getattr(modeling_auto, attr), family) for name, attr, family in HEADS]


def model_types(archs=None) -> list:
    """Every model type with a model class (config-only types, such as the vision half of a
    multimodal config, are parts of the architectures they belong to)."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    types = sorted(set(MODEL_MAPPING_NAMES) | {t for _, m, _ in head_mappings() for t in m})
    if archs:
        unknown = sorted(set(archs) - set(types))
        if unknown:
            raise ValueError(f"unknown model types: {', '.join(unknown)}")
        types = [t for t in types if t in archs]
    return types


def representative(model_type):
    """(head, family, class name) of the class the pipeline builds for a model type."""
    for head, mapping, family in head_mappings():
        if model_type in mapping:
            names = mapping[model_type]
            return head, family, names[0] if isinstance(names, (list, tuple)) else names
    return None, "other", None


def shrink(cfg, depth=0):
    """Sets every known size field of `cfg` (and its sub-configs) to a small value."""
    from transformers import PretrainedConfig
    for key, value in list(vars(cfg).items()):
        if isinstance(value, PretrainedConfig) and depth < 3:
            shrink(value, depth + 1)
        elif key in STAGE_LISTS and isinstance(value, (list, tuple)) and value:
            setattr(cfg, key, [STAGE_LISTS[key] * (1 if key in ("depths", "num_heads") else i + 1)
                               for i in range(len(value))])
        elif key in SMALL and isinstance(SMALL[key], list) and isinstance(value, (list, tuple)):
            setattr(cfg, key, type(value)(SMALL[key]))
        elif key in SMALL and type(value) is type(SMALL[key]) and value is not None:
            setattr(cfg, key, SMALL[key])
        elif key == "layer_types" and isinstance(value, (list, tuple)):
            n = getattr(cfg, "num_hidden_layers", len(value))
            setattr(cfg, key, list(value)[:n] if len(value) >= n else list(value) * n)
    vocab = getattr(cfg, "vocab_size", None)
    if isinstance(vocab, int):
        for key in TOKEN_IDS:
            tid = getattr(cfg, key, None)
            if isinstance(tid, int) and tid >= vocab:
                setattr(cfg, key, min(tid, vocab - 1) if key != "pad_token_id" else 1)
    if getattr(cfg, "is_encoder_decoder", False) and getattr(cfg, "decoder_start_token_id", None) is None:
        cfg.decoder_start_token_id = getattr(cfg, "pad_token_id", None) or 0
    for key, value in list(vars(cfg).items()):
        # Random masks (dropout, layer drop, SpecAugment) cannot match CPU's draws.
        if isinstance(value, float) and any(w in key for w in RANDOM_MASKS):
            setattr(cfg, key, 0.0)
    return cfg


def build(model_type):
    """(model on CPU in train mode, config, head, family, class name); raises when no
    small valid config can be made."""
    import transformers
    head, family, cls_name = representative(model_type)
    if cls_name is None:
        raise LookupError("no model class for this type")
    cfg = shrink(transformers.AutoConfig.for_model(model_type))
    cls = getattr(transformers, cls_name)
    torch.manual_seed(0)
    model = cls(cfg)
    n = sum(p.numel() for p in model.parameters())
    if n > 20_000_000:
        raise ValueError(f"the shrunk model still has {n / 1e6:.0f}M parameters")
    return model, cfg, head, family, cls_name


def _sub(cfg, *names):
    for n in names:
        sub = getattr(cfg, n, None)
        if sub is not None:
            return sub
    return cfg


def inputs(model, cfg, head, batch=2, seq=8):
    """Keyword inputs for `model.forward`, by the names its signature takes."""
    params = inspect.signature(model.forward).parameters
    g = torch.Generator().manual_seed(0)
    text = _sub(cfg, "text_config")
    vocab = getattr(text, "vocab_size", None) or 128
    kw = {}
    ids = torch.randint(3, max(4, min(vocab, 128)), (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, -2:] = 0  # one padded row
    if "input_ids" in params and head not in ("speech_seq2seq", "ctc", "audio_classification",
                                              "image_classification"):
        kw["input_ids"] = ids
        if "attention_mask" in params:
            kw["attention_mask"] = mask
    if "pixel_values" in params:
        vis = _sub(cfg, "vision_config")
        size = getattr(vis, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        kw["pixel_values"] = torch.randn(batch, getattr(vis, "num_channels", 3), size, size, generator=g)
    if "input_features" in params:
        audio = _sub(cfg, "audio_config", "encoder_config")
        frames = 2 * getattr(audio, "max_source_positions", 16)
        kw["input_features"] = torch.randn(batch, getattr(audio, "num_mel_bins", 16), frames, generator=g)
    if "input_values" in params:
        kw["input_values"] = torch.randn(batch, 800, generator=g)
    if "decoder_input_ids" in params and getattr(cfg, "is_encoder_decoder", False):
        kw["decoder_input_ids"] = ids[:, :6]
    if "labels" in params:
        if head in ("causal_lm", "masked_lm"):
            kw["labels"] = ids
        elif head in ("seq2seq_lm", "speech_seq2seq"):
            kw["labels"] = ids[:, :6]
            kw.pop("decoder_input_ids", None)
        elif head in ("sequence_classification", "image_classification", "audio_classification"):
            kw["labels"] = torch.randint(0, getattr(cfg, "num_labels", 2), (batch,), generator=g)
    if not kw:
        raise ValueError("no input this pipeline knows how to make: "
                         + ", ".join(list(params)[:6]))
    return kw


def loss_of(out):
    """The model's own loss, else the mean of every floating output (a scalar to train on)."""
    loss = getattr(out, "loss", None) if not isinstance(out, (tuple, list)) else None
    if loss is not None:
        return loss
    leaves = [t for t in flat_tensors(out) if t.is_floating_point() and t.numel()]
    if not leaves:
        raise ValueError("the model returned no floating tensor")
    return sum(t.float().mean() for t in leaves)


def flat_tensors(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flat_tensors(o)]
    return []


def finite_scale(t: torch.Tensor) -> float:
    v = t.detach().float().abs()
    v = v[torch.isfinite(v)]
    return float(v.max()) if v.numel() else 0.0
