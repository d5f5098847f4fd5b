"""Where PJRT plugins live: the candidates the C++ runtime tries, in order.

TPU_PJRT_PLUGIN=/path/plugin.so always wins (read by the runtime itself).
"""
import importlib.util
import os


def _package_file(module: str, filename: str):
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        path = os.path.join(loc, filename)
        if os.path.exists(path):
            return path
    return None


def candidates():
    found = []
    tpu = _package_file("libtpu", "libtpu.so")
    if tpu:
        found.append((tpu, "libtpu package"))
    cpu = _package_file("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so")
    if cpu:
        found.append((cpu, "xla-cpu-pjrt package"))
    return found
