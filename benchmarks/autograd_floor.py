"""The floor of any attention defined in Python: an autograd.Function of flashtune's shape
(q, k, v saved, one output, three gradients) that does no work but allocate. Used by
host_breakdown.py (CPU) and host_profile_gpu.py (GPU)."""

import torch


class EmptyAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
