"""`synchronize(tensors=None, wait=True)`: materialize pending values, optionally wait."""
from .. import _C


def synchronize(tensors=None, wait: bool = True) -> None:
    # The deferred graph is one program: running it materializes every live tensor,
    # so `tensors` needs no separate treatment.
    if wait:
        _C.synchronize(-1)
    else:
        _C.flush("synchronize")
