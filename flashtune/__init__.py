"""flashtune: FlashAttention forward and backward in Triton, tuned per GPU."""

from flashtune._version import __version__
from flashtune.compat import check_installed as _check_installed

# Before anything imports triton: an unsupported triton fails here with the versions to
# install, not deep inside a kernel module's import.
_check_installed()

__all__ = ["__version__", "attention", "attention_fp8", "attention_jvp", "attention_kvcache", "attention_varlen",
           "get_tuned_attention"]

# torch and triton load on first use, so `flashtune --help` stays instant.
_LAZY = {"attention": "flashtune.kernels", "attention_fp8": "flashtune.kernels",
         "attention_jvp": "flashtune.kernels", "attention_kvcache": "flashtune.kernels",
         "attention_varlen": "flashtune.kernels", "get_tuned_attention": "flashtune.dispatch"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flashtune' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__():
    # the lazy names too: dir() and tab completion show the whole public API
    return sorted(set(globals()) | set(__all__))
