"""tpu tensors through torch.multiprocessing (queues, pipes, Process arguments).

CUDA tensors travel as shared device memory (CUDA IPC). PJRT has no cross-process buffer
sharing, so a tpu tensor travels as a copy: the sender reads it to the host, the receiver
puts it on the same tpu device index. The receiver gets equal values, not shared memory:
writes in one process are not seen by the other. Without this the queue's feeder thread
failed to pickle the tensor and the receiver waited forever.
"""
import torch
from torch.multiprocessing import reductions


def _rebuild(host: torch.Tensor, index: int, requires_grad: bool, is_param: bool):
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
        return _rebuild, (tensor.detach().cpu(), tensor.device.index, tensor.requires_grad,
                          isinstance(tensor, torch.nn.Parameter))
    return reduce


def install() -> None:
    from multiprocessing.reduction import ForkingPickler
    for cls in (torch.Tensor, torch.nn.Parameter):
        ForkingPickler.register(cls, _reducer(reductions.reduce_tensor))
