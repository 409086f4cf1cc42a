"""The Triton kernels: forward, backward, the split-KV forward for decode calls, the JVP, and the
@triton.jit pieces they share."""
