"""tpu tensors through torch.multiprocessing (queues, pipes, Process arguments).

CUDA tensors travel as shared device memory (CUDA IPC). PJRT has no cross-process buffer
sharing, so a tpu tensor travels as a copy: the sender reads it to the host, the receiver
puts it on the same tpu device index (the bytes travel in the pickle, as a spawned child's
arguments need). The receiver gets equal values, not shared memory:
writes in one process are not seen by the other. Without this the queue's feeder thread
failed to pickle the tensor and the receiver waited forever.
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


def install() -> None:
    from multiprocessing.reduction import ForkingPickler
    for cls in (torch.Tensor, torch.nn.Parameter):
        ForkingPickler.register(cls, _reducer(reductions.reduce_tensor))
