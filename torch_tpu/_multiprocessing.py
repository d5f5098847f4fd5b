"""tpu tensors through torch.multiprocessing (queues, pipes, Process arguments).

CUDA tensors travel as shared device memory (CUDA IPC). PJRT has no cross-process buffer
sharing, so a tpu tensor travels as a copy: the sender reads it to the host, the receiver
puts it on the same tpu device index (the bytes travel in the pickle, as a spawned child's
arguments need). The receiver gets equal values, not shared memory:
writes in one process are not seen by the other. Without this the queue's feeder thread
failed to pickle the tensor and the receiver waited forever.

For the same reason a tpu tensor cannot be put in shared memory: share_memory_() (on a
tensor, a storage or through Module.share_memory()) raises instead of doing nothing, and
is_shared() is False. Before, both claimed the tensor was shared, and hogwild-style
training (children update a shared model in place) silently lost every update.
"""
import torch
from torch.multiprocessing import reductions


def _rebuild(data: bytes, dtype, shape, index: int, requires_grad: bool, is_param: bool):
    if len(data) == 0:
        host = torch.empty(shape, dtype=dtype)
    else:
        host = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
    t = host.to(torch.device("tpu", index))
    if is_param:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad)


def _reducer(original):
    def reduce(tensor):
        if tensor.device.type != "tpu":
            return original(tensor)
        if tensor.requires_grad and not tensor.is_leaf:
            raise RuntimeError("Cowardly refusing to serialize non-leaf tensor which requires_grad, "
                               "since autograd does not support crossing process boundaries.")
        # The bytes themselves, not a host tensor: that would travel as shared memory
        # whose file descriptor a spawned child's start-up sends by number only, after the
        # temporary host copy (and the descriptor) is gone.
        host = tensor.detach().cpu().contiguous()
        data = host.reshape(-1).view(torch.uint8).numpy().tobytes()
        return _rebuild, (data, host.dtype, tuple(host.shape), tensor.device.index, tensor.requires_grad,
                          isinstance(tensor, torch.nn.Parameter))
    return reduce


NOT_SHAREABLE = ("tpu tensors cannot be shared between processes: PJRT has no cross-process device memory, so a "
                 "tpu tensor passed to another process arrives as a copy and its writes there are not seen here. "
                 "For hogwild-style training share a CPU copy (model.cpu().share_memory()) and update that.")


def _refuse_tpu_sharing() -> None:
    # Tensor.share_memory_, TypedStorage and Module.share_memory all come to the untyped
    # storage's methods.
    share_memory_ = torch.UntypedStorage.share_memory_
    is_shared = torch.UntypedStorage.is_shared

    def share_memory_tpu_refused(self, *args, **kwargs):
        if self.device.type == "tpu":
            raise RuntimeError(NOT_SHAREABLE)
        return share_memory_(self, *args, **kwargs)

    def is_shared_tpu_false(self):
        if self.device.type == "tpu":
            return False
        return is_shared(self)

    share_memory_tpu_refused.__doc__ = share_memory_.__doc__
    is_shared_tpu_false.__doc__ = is_shared.__doc__
    torch.UntypedStorage.share_memory_ = share_memory_tpu_refused
    torch.UntypedStorage.is_shared = is_shared_tpu_false


def install() -> None:
    from multiprocessing.reduction import ForkingPickler
    for cls in (torch.Tensor, torch.nn.Parameter):
        ForkingPickler.register(cls, _reducer(reductions.reduce_tensor))
    _refuse_tpu_sharing()
