"""The persistent compile cache: a second process compiles nothing; corrupt entries are
recompiled; the directory stays within its bound; it can be switched off."""
import os

from conftest import run_python_json

PROGRAM = (
    "import json, torch, torch_tpu\n"
    "x = torch.arange(12.0, device='tpu').reshape(3, 4)\n"
    "y = (x.softmax(-1) @ x.T).tanh().sum(0)\n"
    "with torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):\n"
    "    z = ((x * 3).relu() + y.unsqueeze(1)).mean()\n"
    "    v = z.item()\n"
    "m = torch_tpu.metrics()\n"
    "print(json.dumps({'y': y.tolist(), 'v': v, 'compiles': m['compiles'],\n"
    "                  'hits': m.get('disk_cache_hits', 0), 'corrupt': m.get('disk_cache_corrupt', 0),\n"
    "                  'evicted': m.get('disk_cache_evicted', 0),\n"
    "                  'writes': m.get('disk_cache_writes', 0), 'scans': m.get('disk_cache_scans', 0), 'dir': torch_tpu._C.compile_cache_dir(),\n"
    "                  'compile_s': m['compile_seconds'], 'load_s': m['cache_load_seconds']}))\n"
)


def run(cache_dir, **env):
    return run_python_json(PROGRAM, env={"TPU_COMPILE_CACHE_DIR": str(cache_dir), **env})


def test_second_process_compiles_nothing(tmp_path):
    cold = run(tmp_path)
    warm = run(tmp_path)
    assert cold["compiles"] > 0 and cold["hits"] == 0
    assert warm["compiles"] == 0 and warm["hits"] >= cold["compiles"]
    # Time goes to compiling in the first process and to loading in the second.
    assert cold["compile_s"] > 0 and cold["load_s"] == 0
    assert warm["compile_s"] == 0 and warm["load_s"] > 0
    assert warm["y"] == cold["y"] and warm["v"] == cold["v"]
    assert any(f.endswith(".exe") for f in os.listdir(tmp_path))


def test_other_xla_flags_do_not_reuse_entries(tmp_path):
    base = run(tmp_path, XLA_FLAGS="")
    other = run(tmp_path, XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    assert base["compiles"] > 0 and other["compiles"] == base["compiles"] and other["hits"] == 0
    assert run(tmp_path, XLA_FLAGS="--xla_cpu_enable_fast_math=false")["compiles"] == 0


def test_corrupt_entries_are_detected_and_recompiled(tmp_path):
    cold = run(tmp_path)
    entries = [f for f in os.listdir(tmp_path) if f.endswith(".exe")]
    for i, f in enumerate(entries):
        with open(tmp_path / f, "r+b") as fh:
            if i % 2:
                fh.truncate(40)            # torn write
            else:
                fh.seek(-20, os.SEEK_END)  # flipped payload bytes
                fh.write(b"\x00" * 12)
    again = run(tmp_path)
    assert again["corrupt"] == len(entries)
    assert again["compiles"] == cold["compiles"]
    assert again["y"] == cold["y"] and again["v"] == cold["v"]
    assert run(tmp_path)["compiles"] == 0  # rewritten entries are good


def test_cache_stays_within_its_size_bound(tmp_path):
    bound = 0.02  # MiB: fewer bytes than this program's executables need
    out = run(tmp_path, TPU_COMPILE_CACHE_MAX_MB=str(bound))
    sizes = [os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path)]
    assert out["evicted"] > 0
    assert sum(sizes) <= bound * (1 << 20)
    assert run(tmp_path, TPU_COMPILE_CACHE_MAX_MB=str(bound))["y"] == out["y"]


def test_writes_do_not_list_the_directory_each_time(tmp_path):
    # Listing a cache of tens of thousands of entries took 0.16 s, once per compiled
    # program: most of a cold conformance run. One listing per process under the bound.
    for i in range(300):
        (tmp_path / f"{i:04x}.exe").write_bytes(b"x" * 10)
    out = run(tmp_path)
    assert out["writes"] >= 5
    assert out["scans"] == 1
    assert out["evicted"] == 0


def test_cache_can_be_switched_off(tmp_path):
    out = run(tmp_path, TPU_COMPILE_CACHE="0")
    assert out["dir"] == "" and out["hits"] == 0
    assert os.listdir(tmp_path) == []


def test_loaded_programs_are_bounded_and_reload_when_used_again(tmp_path):
    # Each loaded executable holds code mappings; a process that kept meeting new shapes
    # (a conformance worker) reached the kernel's 65,530 mappings and died with SIGSEGV.
    prog = (
        "import json, os, torch, torch_tpu\n"
        "maps = lambda: sum(1 for _ in open(f'/proc/{os.getpid()}/maps'))\n"
        "x = torch.arange(6.0, device='tpu')\n"
        "first = (x * 2 + 1).cpu()\n"
        "m0 = maps()\n"
        "sums = [(torch.ones(n, device='tpu') * 3).sum().item() for n in range(1, 121)]\n"
        "grown = maps() - m0\n"
        "again = (x * 2 + 1).cpu()\n"  # its program was unloaded: reloaded from disk
        "with torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):\n"
        "    fused = [((torch.ones(n, device='tpu') + 1) * 2).sum().item() for n in (3, 5, 3)]\n"
        "m = torch_tpu.metrics()\n"
        "print(json.dumps({'ok': sums == [3.0 * n for n in range(1, 121)] and torch.equal(first, again)\n"
        "                        and fused == [12.0, 20.0, 12.0],\n"
        "                  'unloaded': m['programs_unloaded'], 'grown': grown}))\n")
    out = run_python_json(prog, env={"TPU_COMPILE_CACHE_DIR": str(tmp_path), "TPU_MAX_LOADED_PROGRAMS": "16"})
    assert out["ok"]
    assert out["unloaded"] >= 200  # 240 programs through a bound of 16
    assert out["grown"] < 200  # unbounded: about 4 mappings per program, ~1,000 here


def test_loaded_programs_are_bounded_by_the_processs_mappings(tmp_path):
    # Programs holding many mappings each (RNN graphs: hundreds) reached the kernel's
    # limit under the count bound; past TPU_MAX_MAPPINGS the older half is unloaded.
    prog = (
        "import json, torch, torch_tpu\n"
        "sums = [(torch.ones(n, device='tpu') * 3).sum().item() for n in range(1, 81)]\n"
        "again = [(torch.ones(n, device='tpu') * 3).sum().item() for n in (1, 2, 3)]\n"
        "print(json.dumps({'ok': sums == [3.0 * n for n in range(1, 81)] and again == [3.0, 6.0, 9.0],\n"
        "                  'unloaded': torch_tpu.metrics()['programs_unloaded']}))\n")
    out = run_python_json(prog, env={"TPU_COMPILE_CACHE_DIR": str(tmp_path), "TPU_MAX_MAPPINGS": "1"})
    assert out["ok"]
    assert out["unloaded"] >= 40  # every 16th load halves what is loaded
    out = run_python_json(prog, env={"TPU_COMPILE_CACHE_DIR": str(tmp_path)})
    assert out["ok"] and out["unloaded"] == 0  # far below the default budget


# A fused graph and a compiled graph, after `prelude` (other programs made first, so this
# process numbers the graphs' programs differently).
GRAPHS = (
    "import json, torch, torch_tpu\n"
    "{prelude}\n"
    "x = torch.arange(12.0, device='tpu').reshape(3, 4)\n"
    "with torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):\n"
    "    v = ((x * 3).relu() + x.softmax(-1)).mean().item()\n"
    "f = torch.compile(lambda t: (t.exp() * 2 - t).sum(0), backend='tpu')\n"
    "w = f(x).tolist()\n"
    "m = torch_tpu.metrics()\n"
    "print(json.dumps({'v': v, 'w': w, 'graph_compiles': m['graph_compiles']}))\n"
)


def test_graphs_are_found_again_by_a_process_with_another_history(tmp_path):
    env = {"TPU_COMPILE_CACHE_DIR": str(tmp_path)}
    first = run_python_json(GRAPHS.replace("{prelude}", ""), env=env)
    prelude = ("y = torch.ones(5, device='tpu')\n"
               "with torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):\n"
               "    (y.cos() * 4 + y.sin()).sum().item()\n"
               "(y.tanh() - 1).abs().sum().item()\n")
    other = run_python_json(GRAPHS.replace("{prelude}", prelude), env=env)
    assert first["graph_compiles"] >= 2
    # Only the prelude's own graph compiles: the others are the disk cache's.
    assert other["graph_compiles"] == 1
    assert other["v"] == first["v"] and other["w"] == first["w"]


def test_entries_are_keyed_by_the_host_cpu(tmp_path):
    """An executable from a machine with other instruction-set features (AVX-512 on one
    x86-64, not on the next) must never load: every entry's key names this CPU's."""
    import platform

    import torch_tpu

    sig = torch_tpu._C._host_cpu_signature()
    run(tmp_path)
    entries = [tmp_path / f for f in os.listdir(tmp_path) if f.endswith(".exe")]
    assert entries and all(sig.encode() in e.read_bytes() for e in entries)
    if platform.machine() in ("x86_64", "AMD64") and os.path.exists("/proc/cpuinfo"):
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
        leaf7_ebx = int(sig.split(" 7:")[1].split(".")[0], 16)
        # CPUID.7.0:EBX bit 5 is AVX2, bit 16 AVX512F (the kernel lists AVX-512 only where
        # it enables its register state, so only that direction holds for it).
        assert bool(leaf7_ebx & (1 << 5)) == ("avx2" in flags)
        assert not ("avx512f" in flags) or leaf7_ebx & (1 << 16)
