"""torch.cuda.streams' names."""
from . import Event, Stream  # noqa: F401
