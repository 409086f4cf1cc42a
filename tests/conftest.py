"""Session setup that must run before anything imports triton.

Without a GPU the Triton kernels run under Triton's interpreter on CPU tensors, and the
interpreter must be switched on before triton is first imported (triton decides when a
@triton.jit function is decorated). A TRITON_INTERPRET already set by the caller wins.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
