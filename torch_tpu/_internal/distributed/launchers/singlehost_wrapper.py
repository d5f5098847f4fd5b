"""Environment for one process per chip on one host (torchrun or hand-spawned)."""
import os


def prepare_tpu_environment(world_size=None):
    """Fills the rendezvous variables torchrun would set and picks this process's chip
    (TPU_VISIBLE_CHIPS = LOCAL_RANK unless already set). Returns what it set."""
    env = {}

    def default(key, value):
        if key not in os.environ:
            os.environ[key] = env[key] = str(value)

    if world_size is not None:
        default("WORLD_SIZE", world_size)
    default("RANK", os.environ.get("LOCAL_RANK", 0))
    default("LOCAL_RANK", os.environ["RANK"])
    default("WORLD_SIZE", 1)
    default("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])
    default("MASTER_ADDR", "127.0.0.1")
    default("MASTER_PORT", 29500)
    default("TPU_VISIBLE_CHIPS", os.environ["LOCAL_RANK"])
    return env
