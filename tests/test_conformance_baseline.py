"""Regression guard: a stratified sample of the op_db entries that ran natively in the
checked-in full run (tests/conformance_baseline.json, from `make conformance`) must still
run natively, forward and backward, in float32."""
import json
import os

from conftest import ROOT
from torch_tpu import conformance

BASELINE = os.path.join(ROOT, "tests", "conformance_baseline.json")
# At least one entry per op family, then about SAMPLE more by family size: 60 entries at the
# baseline's sample count (8) cost about what 144 entries at 3 samples did, a few minutes.
SAMPLE = 24


def test_baseline_native_entries_stay_native(tmp_path):
    with open(BASELINE) as f:
        base = json.load(f)
    keys = conformance.stratified_sample(base, SAMPLE)
    assert len(keys) >= SAMPLE
    assert base["meta"]["max_samples"] is not None  # all samples would not fit CI's minutes
    families = {k.rsplit(".", 1)[0] for k in keys if "." in k}
    assert {"linalg", "nn.functional", "special"} <= families  # spread over the families
    # The baseline's own sample count: fewer samples could miss what it verified.
    res = conformance.run(keys, ("float32",), max_samples=base["meta"]["max_samples"], jobs=2, timeout=120,
                          out=str(tmp_path), progress=False)
    lost = conformance.regressions(base, res["entries"])
    assert not lost, "entries native in the baseline are not native now:\n" + "\n".join(lost)


COMPILED_BASELINE = os.path.join(ROOT, "tests", "conformance_compiled_baseline.json")
# Each compiled sample traces with Dynamo and AOTAutograd and compiles its own programs:
# fewer entries and samples than the eager guard (entries native with the baseline's 4
# samples are native with their first 2).
COMPILED_SAMPLE, COMPILED_SAMPLES = 12, 2


def test_compiled_baseline_native_entries_stay_native(tmp_path):
    with open(COMPILED_BASELINE) as f:
        base = json.load(f)
    assert base["meta"]["compiled"] is True
    keys = conformance.stratified_sample(base, COMPILED_SAMPLE)
    assert len(keys) >= COMPILED_SAMPLE
    res = conformance.run(keys, ("float32",), max_samples=COMPILED_SAMPLES, jobs=2, timeout=300,
                          out=str(tmp_path), progress=False, compiled=True)
    lost = conformance.regressions(base, res["entries"])
    assert not lost, "entries native in the compiled baseline are not native now:\n" + "\n".join(lost)
