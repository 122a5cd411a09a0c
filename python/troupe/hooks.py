"""DDP communication hooks on troupe's gradient compression, for PyTorch's
DistributedDataParallel.register_comm_hook, over whatever process group DDP uses (gloo, say):

    import troupe.hooks
    state = troupe.hooks.CompressionState("2bit", threshold=0.01)
    ddp.register_comm_hook(state, troupe.hooks.compression_hook)

Each bucket's gradient is encoded as troupe's transport encodes it ("fp16", "bf16", or MXNet's
"2bit": with threshold t, g + residual becomes +t, -t or 0 and the rest stays in a residual that
is added to the bucket's next gradient: error feedback), the ranks' bytes are all-gathered (2bit:
16 times fewer bytes than float32), and every rank decodes them to the same floats and averages
them, as DDP's allreduce would average the gradients themselves. A bucket's residual is kept by
its index (DDP rebuilds its buckets once, after the first step: a bucket whose size changed starts
its residual anew, as PyTorch's PowerSGD hook does).
"""
import numpy as np
import torch
import torch.distributed as dist

from . import _troupe


class CompressionState:
    """What compression_hook compresses with, and the residuals it carries between steps."""

    def __init__(self, compression="2bit", threshold=0.5, process_group=None):
        _troupe.encoded_size(compression, 1)  # troupe.Error for an unknown type, here
        if compression == "2bit" and not threshold > 0:
            raise ValueError(f"2bit compression: threshold {threshold} is not > 0")
        self.compression = compression
        self.threshold = float(threshold)
        self.process_group = process_group
        self.residuals = {}  # a bucket's index -> its residual (2bit)

    def residual(self, index, size):
        r = self.residuals.get(index)
        if r is None or r.size != size:
            r = self.residuals[index] = np.zeros(size, dtype=np.float32)
        return r


def compression_hook(state, bucket):
    """The bucket's gradient, compressed, all-gathered and averaged over the ranks (a future of
    it, as DDP's hooks return)."""
    grad = bucket.buffer()
    values = np.ascontiguousarray(grad.detach().to("cpu", torch.float32).numpy().reshape(-1))
    residual = (state.residual(bucket.index(), values.size) if state.compression == "2bit"
                else None)
    sent = torch.from_numpy(_troupe.encode(state.compression, state.threshold, values, residual))
    world = dist.get_world_size(state.process_group)
    gathered = [torch.empty_like(sent) for _ in range(world)]
    work = dist.all_gather(gathered, sent, group=state.process_group, async_op=True)

    def average(_):
        total = np.zeros(values.size, dtype=np.float32)
        for part in gathered:
            _troupe.decode(state.compression, state.threshold, part.numpy(), total, True)
        total /= world
        grad.copy_(torch.from_numpy(total).view_as(grad))
        return grad

    return work.get_future().then(average)
