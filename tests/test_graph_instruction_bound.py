"""DeferAndFuse cuts a pending graph before its calls' operations pass a bound
(TPU_FUSE_MAX_INSTRUCTIONS), where its calls start to repeat: a model initialized on the
device (hundreds of normal_ calls of about 250 operations each) compiled for minutes and
took gigabytes as one program; cut, the pieces share one compile and the values are
those of Strict, bit for bit."""

from conftest import run_python_json

INIT = (
    "import json, torch, torch_tpu\n"
    "torch_tpu.set_eager_mode(torch_tpu.EagerMode.{mode})\n"
    "torch.manual_seed(3)\n"
    "xs = [torch.empty(4, 4, device='tpu') for _ in range(300)]\n"
    "for x in xs: torch.nn.init.normal_(x, std=0.02)\n"
    "vals = torch.stack([x.cpu() for x in xs]).flatten().tolist()\n"
    "m = torch_tpu.metrics()\n"
    "print(json.dumps({{'vals': vals, 'cuts': m['flushes'].get('graph instruction bound', 0),\n"
    "                  'largest': m['largest_graph_instructions'], 'graph_compiles': m['graph_compiles']}}))\n"
)


def test_many_random_fills_are_cut_into_repeating_graphs():
    env = {"TPU_FUSE_MAX_INSTRUCTIONS": "5000", "TPU_COMPILE_CACHE": "0"}
    fused = run_python_json(INIT.format(mode="DEFER_AND_FUSE"), env=env)
    strict = run_python_json(INIT.format(mode="DEFER_NEVER"), env=env)
    assert fused["vals"] == strict["vals"]
    assert fused["cuts"] >= 10                 # 300 fills of about 250 operations
    assert 0 < fused["largest"] <= 5000
    assert fused["graph_compiles"] <= 4        # the cut graphs repeat: one compile
    assert strict["cuts"] == 0


def test_the_default_bound_leaves_a_training_step_whole():
    code = (
        "import json, os, sys, torch, torch_tpu\n"
        "sys.path.insert(0, 'examples')\n"
        "from gpt import GPT, batches\n"
        "torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)\n"
        "torch.manual_seed(0)\n"
        "model = GPT(vocab=64, d_model=32, n_heads=2, n_layers=2, seq=16).to('tpu')\n"
        "opt = torch.optim.AdamW(model.parameters())\n"
        "for x, y in batches(64, 16, 2, 2):\n"
        "    loss = model(x.to('tpu'), y.to('tpu'))[1]\n"
        "    loss.backward(); opt.step(); opt.zero_grad(); loss.item()\n"
        "m = torch_tpu.metrics()\n"
        "print(json.dumps({'cuts': m['flushes'].get('graph instruction bound', 0),\n"
        "                  'largest': m['largest_graph_instructions']}))\n"
    )
    r = run_python_json(code)
    assert r["cuts"] == 0
    assert r["largest"] > 1000                 # counted: a step is thousands of operations
