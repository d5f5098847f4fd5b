"""`synchronize(tensors=None, wait=True)`: materialize and (optionally) wait."""
from .. import _C


def synchronize(tensors=None, wait: bool = True) -> None:
    # Strict and Debug modes launch every op at once: nothing is pending but device work.
    if wait:
        _C.synchronize(-1)
