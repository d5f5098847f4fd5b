"""Stage 2: a stratified, deterministic sample of model classes, so that every task head
transformers defines is exercised, not only each model type's representative class.

Strata are task head x modality (the family of the model type: decoder, encoder, vision,
...), decoders split further into MoE and dense. From each stratum the `per_stratum`
classes whose seeded hash is smallest are drawn: the same sample on every machine, and
a larger size keeps the smaller sample's classes."""
import collections
import hashlib

# Config fields that make a decoder a mixture of experts when above 1.
EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def heads() -> dict:
    """{task head: {model type: class name}} for every MODEL_FOR_*_MAPPING_NAMES of the
    pinned transformers ("base" for MODEL_MAPPING_NAMES)."""
    from transformers.models.auto import modeling_auto as m
    out = {}
    for attr in sorted(dir(m)):
        table = getattr(m, attr)
        if not (attr.startswith("MODEL_") and attr.endswith("_MAPPING_NAMES") and isinstance(table, dict)):
            continue
        name = attr[len("MODEL_FOR_"):-len("_MAPPING_NAMES")].lower() if attr.startswith(
            "MODEL_FOR_") else "base"
        out[name] = {t: c[0] if isinstance(c, (list, tuple)) else c for t, c in table.items()}
    return out


def class_of(head, model_type) -> str:
    table = heads().get(head)
    if table is None:
        raise LookupError(f"unknown task head {head!r}")
    if model_type not in table:
        raise LookupError(f"{model_type} has no class for task head {head!r}")
    return table[model_type]


def is_moe(model_type) -> bool:
    import transformers
    try:
        cfg = transformers.AutoConfig.for_model(model_type)
    except Exception:  # noqa: BLE001 -- a config that cannot be made is not MoE here
        return False
    from torch_tpu.compat.models import _configs
    return any(isinstance(vars(c).get(k), int) and vars(c)[k] > 1
               for c in _configs(cfg) for k in EXPERT_FIELDS)


# A model type's modality: the first of these head groups that has a class for it.
MODALITIES = (("audio", ("speech_seq_2_seq", "ctc", "audio_classification", "audio_xvector")),
              ("multimodal", ("image_text_to_text", "multimodal_lm", "visual_question_answering")),
              ("vision", ("image_classification", "backbone", "image", "semantic_segmentation",
                          "object_detection")),
              ("encoder-decoder", ("seq_to_seq_causal_lm",)),
              ("encoder", ("masked_lm",)),
              ("decoder", ("causal_lm",)))


def modality(model_type, table=None) -> str:
    table = table or heads()
    for name, group in MODALITIES:
        if any(model_type in table.get(h, ()) for h in group):
            return name
    return "other"


def stratum(head, model_type, table=None) -> str:
    family = modality(model_type, table)
    if family == "decoder":
        family = "decoder-moe" if is_moe(model_type) else "decoder-dense"
    return f"{head} x {family}"


def _rank(seed, key) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def sample(per_stratum=2, seed=0, heads_only=None) -> dict:
    """{stratum: [key, ...]} with keys "head/model_type"; every task head appears."""
    from torch_tpu.compat.models import model_types
    known = set(model_types())
    strata = collections.defaultdict(list)
    everything = heads()
    for head, table in everything.items():
        if heads_only and head not in heads_only:
            continue
        for t in table:
            if t in known:
                strata[stratum(head, t, everything)].append(f"{head}/{t}")
    return {s: sorted(keys, key=lambda k: _rank(seed, k))[:per_stratum]
            for s, keys in sorted(strata.items())}


def keys(per_stratum=2, seed=0) -> list:
    return sorted(k for ks in sample(per_stratum, seed).values() for k in ks)
