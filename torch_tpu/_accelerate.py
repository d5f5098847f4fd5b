"""Hugging Face accelerate (and so `transformers.Trainer`) picks `tpu` as CUDA would be picked.

accelerate chooses its device from a fixed list (cuda, mps, xpu, npu, hpu, ...) and has no
hook for an out-of-tree PyTorch device; its "TPU" means PyTorch/XLA. transformers already
asks `torch.tpu` for the device and for bf16 support, but the model is placed by accelerate,
which would keep it on the CPU. So when `accelerate.state` is imported, its
`PartialState.default_device` (what accelerate falls back to when nothing else is set)
answers `tpu` where it would answer `cpu`, and under torchrun the ranks form a process
group over Gloo and tpu_dist, each on its own tpu device, with DDP around the model. Nothing explicit is overridden: the
`ACCELERATE_TORCH_DEVICE` variable, `cpu=True` (`TrainingArguments(use_cpu=True)`), and
every real accelerator accelerate finds first keep their meaning.

fp16 mixed precision (`TrainingArguments(fp16=True)`) works as on CUDA: accelerate refuses
it on any device outside a fixed tuple in `Accelerator.__init__`, which gains "tpu", and
its gradient scaler is `torch.amp.GradScaler("tpu")` (accelerate's fallback is CUDA's,
which disables itself where CUDA is absent: fp16 gradients would underflow unscaled).

`device_map="auto"` (`from_pretrained`, `infer_auto_device_map`) places a model on tpu as
on CUDA: accelerate's memory inventory (`get_max_memory`) asks each accelerator of its list
for free memory and finds none, so everything went to the CPU; tpu devices now report
theirs (`torch.tpu.mem_get_info`), under the integer indices CUDA devices would have.

Checkpoints keep tpu's random state: `Trainer` (`rng_state.pth`) and accelerate's
`save_state` (`random_states_N.pkl`) save the states of a fixed list of devices, so a
resumed run drew other dropout masks than the uninterrupted one. Each also writes
`tpu_rng_state[_N].pth` (one state per tpu device) beside its own file and restores it.

The patches are applied when accelerate is imported, never by importing it here: `import torch`
must stay fast. `TPU_ACCELERATE=0` leaves accelerate alone.
"""
import os

from . import _on_import



# The process-group backend a torchrun launch gets: Gloo for CPU tensors, tpu_dist for tpu.
_BACKEND = "cpu:gloo,tpu:tpu_dist"


def _patch_state(state_module) -> None:
    cls = state_module.PartialState
    if getattr(cls, "_torch_tpu", False):
        return
    cls._torch_tpu = True
    DistributedType = state_module.DistributedType
    default_device, prepare_backend, set_device = cls.default_device, cls._prepare_backend, cls.set_device

    def tpu_default_device(self):
        import torch
        device = default_device.fget(self)
        if device.type == "cpu" and torch.tpu.is_available():
            return torch.device("tpu", torch.tpu.current_device())
        return device

    # Under torchrun (LOCAL_RANK set) accelerate finds no accelerator of its list and would
    # run each rank alone. With tpu it runs as accelerate's CPU multi-process type, whose
    # models are wrapped in DDP without device_ids (as tpu_dist wants), over Gloo + tpu_dist,
    # each rank on its own tpu device.
    def tpu_prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        import torch
        got, kind = prepare_backend(self, cpu, sagemaker_dp, backend)
        if (kind == DistributedType.NO and not cpu and backend in (None, "tpu_dist", _BACKEND)
                and int(os.environ.get("LOCAL_RANK", -1)) != -1 and torch.tpu.is_available()):
            return _BACKEND, DistributedType.MULTI_CPU
        return got, kind

    def tpu_set_device(self):
        if self.device is None and self.backend == _BACKEND:
            import torch
            self.device = torch.device("tpu", self.local_process_index % torch.tpu.device_count())
            torch.tpu.set_device(self.device)
            return
        set_device(self)

    cls.default_device = property(tpu_default_device, doc=default_device.__doc__)
    cls._prepare_backend = tpu_prepare_backend
    cls.set_device = tpu_set_device


def _patch_accelerator(module) -> None:
    cls = module.Accelerator
    if getattr(cls, "_torch_tpu", False):
        return
    cls._torch_tpu = True
    # The devices fp16 is allowed on: a constant tuple of the constructor's code.
    init = cls.__init__
    code = init.__code__
    consts = tuple(c + ("tpu",) if isinstance(c, tuple) and "cuda" in c and "mps" in c and "tpu" not in c else c
                   for c in code.co_consts)
    init.__code__ = code.replace(co_consts=consts)
    get_grad_scaler = module.get_grad_scaler

    def tpu_grad_scaler(distributed_type=None, **kwargs):
        import torch
        if module.AcceleratorState().device.type == "tpu" and distributed_type != module.DistributedType.FSDP:
            return torch.amp.GradScaler("tpu", **kwargs)
        return get_grad_scaler(distributed_type, **kwargs)

    module.get_grad_scaler = tpu_grad_scaler
    save_state, load_state = module.save_accelerator_state, module.load_accelerator_state

    def tpu_save_state(output_dir, *args, **kwargs):
        location = save_state(output_dir, *args, **kwargs)
        _save_tpu_rng(os.path.join(output_dir, f"tpu_rng_state_{_process_index(args, kwargs, 4)}.pth"))
        return location

    def tpu_load_state(input_dir, *args, **kwargs):
        found = load_state(input_dir, *args, **kwargs)
        _load_tpu_rng(os.path.join(input_dir, f"tpu_rng_state_{_process_index(args, kwargs, 4)}.pth"))
        return found

    module.save_accelerator_state, module.load_accelerator_state = tpu_save_state, tpu_load_state


def _process_index(args, kwargs, at):
    """The `process_index` argument of accelerate's save/load_accelerator_state."""
    return kwargs["process_index"] if "process_index" in kwargs else args[at]


def _save_tpu_rng(path) -> None:
    import torch
    if torch.tpu.is_available():
        torch.save(torch.tpu.get_rng_state_all(), path)


def _load_tpu_rng(path) -> None:
    import torch
    if not (torch.tpu.is_available() and os.path.isfile(path)):
        return
    states = torch.load(path, weights_only=True)
    if len(states) == torch.tpu.device_count():
        torch.tpu.set_rng_state_all(states)
    else:  # another number of devices: this process's own
        torch.tpu.set_rng_state(states[min(torch.tpu.current_device(), len(states) - 1)])


def _patch_trainer(module) -> None:
    cls = module.Trainer
    if getattr(cls, "_torch_tpu", False):
        return
    cls._torch_tpu = True
    save, load = cls._save_rng_state, cls._load_rng_state

    def name(self):
        return "tpu_rng_state.pth" if self.args.world_size <= 1 else f"tpu_rng_state_{self.args.process_index}.pth"

    def tpu_save_rng_state(self, output_dir):
        save(self, output_dir)
        _save_tpu_rng(os.path.join(output_dir, name(self)))

    def tpu_load_rng_state(self, checkpoint):
        load(self, checkpoint)
        if checkpoint is not None:
            _load_tpu_rng(os.path.join(checkpoint, name(self)))

    cls._save_rng_state, cls._load_rng_state = tpu_save_rng_state, tpu_load_rng_state


def _patch_modeling(module) -> None:
    get_max_memory = module.get_max_memory
    if getattr(get_max_memory, "_torch_tpu", False):
        return

    def tpu_max_memory(max_memory=None):
        import torch
        found = get_max_memory(max_memory)
        if max_memory is None and not any(isinstance(k, int) for k in found) and torch.tpu.is_available():
            for i in range(torch.tpu.device_count()):
                found[i] = torch.tpu.mem_get_info(i)[0]
        return found

    tpu_max_memory._torch_tpu = True
    module.get_max_memory = tpu_max_memory


def _patch_dynamo_backends(module) -> None:
    """`torch_compile_backend="tpu"` (TrainingArguments, accelerate's dynamo plugin): its
    backends are a fixed enum, which gains TPU (accelerate compiles with the lowercased
    value, torch.compile(backend="tpu"))."""
    cls = module.DynamoBackend
    if "TPU" in cls.__members__:
        return
    member = str.__new__(cls, "TPU")
    member._name_, member._value_ = "TPU", "TPU"
    cls._member_map_["TPU"] = member
    cls._value2member_map_["TPU"] = member
    cls._member_names_.append("TPU")


_PATCHES = {"accelerate.state": ("PartialState", _patch_state),
            "accelerate.utils.dataclasses": ("DynamoBackend", _patch_dynamo_backends),
            "accelerate.accelerator": ("Accelerator", _patch_accelerator),
            "accelerate.utils.modeling": ("get_max_memory", _patch_modeling),
            "transformers.trainer": ("Trainer", _patch_trainer)}


def install() -> None:
    if os.environ.get("TPU_ACCELERATE", "1") == "0":
        return
    for name, (defines, patch) in _PATCHES.items():
        _on_import.patch_when_imported(name, defines, patch)
