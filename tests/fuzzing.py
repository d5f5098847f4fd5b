"""Shared pieces of the hypothesis fuzz suites (test_fuzz*.py)."""
import os

from hypothesis import HealthCheck, settings

from torch_tpu import EagerMode

MODES = {"strict": EagerMode.DEFER_NEVER, "fused": EagerMode.DEFER_AND_FUSE}


def fuzz_settings(examples):
    """`examples` derandomized cases (CI runs the same ones every time), or, with
    TPU_FUZZ_EXAMPLES=N set, N random cases: a campaign."""
    campaign = int(os.environ.get("TPU_FUZZ_EXAMPLES", "0"))
    return settings(max_examples=campaign or examples, deadline=None, derandomize=not campaign, database=None,
                    suppress_health_check=list(HealthCheck))


def check_outcomes_alike(want, got, what):
    """CPU's outcome `want` and tpu's `got`, each a value or the exception raised: both
    raise, an exception of one kind, or neither does. True when both raised."""
    if isinstance(want, Exception):
        assert isinstance(got, Exception), f"{what}: CPU raised {want!r}, tpu returned {got!s:.300}"
        assert isinstance(got, type(want)) or isinstance(want, type(got)), \
            f"{what}: CPU raised {type(want).__name__}, tpu {type(got).__name__}: {got}"
        return True
    assert not isinstance(got, Exception), f"{what}: tpu raised {got!r}, CPU worked: {want!s:.300}"
    return False
