"""torch.cuda.random's names (seeds and generator states of the tpu devices)."""
from . import (get_rng_state, get_rng_state_all, initial_seed, manual_seed, manual_seed_all,  # noqa: F401
               seed, seed_all, set_rng_state, set_rng_state_all)
