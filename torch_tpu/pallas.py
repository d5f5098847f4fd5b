"""Custom JAX / Pallas kernels on tpu tensors: see torch_tpu._internal.pallas.

Importing this module does not import JAX; the first `jax_op` does.
"""
from ._internal.pallas import custom_jax_kernel, jax_op

__all__ = ["jax_op", "custom_jax_kernel"]
