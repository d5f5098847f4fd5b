"""DeferAndFuse buffer donation: an input no one else holds gives its memory to an
output of its type (an optimizer's update reuses the parameter's memory). On the XLA CPU
plugin donation is off unless TPU_FUSE_DONATE=1 is set at process start (the runtime then
turns XNNPACK off: see runtime::Client::donation_safe), so each case runs in a fresh
process (tests/donation_cases.py)."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

CASES = os.path.join(ROOT, "tests", "donation_cases.py")


def run_case(name, donate):
    env = dict(os.environ)
    env.pop("TPU_FUSE_DONATE", None)
    if donate:
        env["TPU_FUSE_DONATE"] = "1"
    r = subprocess.run([sys.executable, CASES, name], capture_output=True, text=True, env=env,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
    return r


@pytest.mark.parametrize("case", [
    "in_place_updates_donate_and_views_see_them",
    "donation_does_not_depend_on_whether_the_producing_graph_finished",
    "a_weight_updated_in_place_is_read_anew",
    "a_cut_between_backward_and_step_gives_strict_gradients",
])
def test_with_donation(case):
    run_case(case, donate=True)


def test_cpu_plugin_does_not_donate_by_default():
    r = run_case("cpu_plugin_does_not_donate_by_default", donate=False)
    assert "donation needs it at process start" in r.stderr
