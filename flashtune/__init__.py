"""flashtune: FlashAttention forward and backward in Triton, tuned per GPU."""

from flashtune._version import __version__

__all__ = ["__version__", "attention", "attention_fp8", "attention_jvp", "attention_kvcache", "attention_varlen",
           "get_tuned_attention"]


def __getattr__(name):
    # torch and triton load on first use, so `flashtune --help` stays instant.
    if name == "attention":
        from flashtune.kernels import attention

        return attention
    if name == "attention_fp8":
        from flashtune.kernels import attention_fp8

        return attention_fp8
    if name == "attention_jvp":
        from flashtune.kernels import attention_jvp

        return attention_jvp
    if name == "attention_kvcache":
        from flashtune.kernels import attention_kvcache

        return attention_kvcache
    if name == "attention_varlen":
        from flashtune.kernels import attention_varlen

        return attention_varlen
    if name == "get_tuned_attention":
        from flashtune.dispatch import get_tuned_attention

        return get_tuned_attention
    raise AttributeError(f"module 'flashtune' has no attribute {name!r}")
