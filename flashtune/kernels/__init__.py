"""FlashAttention forward and backward kernels (Triton, and Gluon on sm_90), launched with explicit
configs: the public entry points (api.py), the choice of family and config per call (passes.py),
the kernel families (triton/, gluon/)."""

from flashtune.configs import BwdConfig, ConfigError, FwdConfig, padded_head_dim
from flashtune.heuristics import default_config
from flashtune.kernels.api import (FlashAttentionFunction, FlashAttentionJvpFunction, attention, attention_jvp,
                                   attention_varlen, check_inputs, check_varlen_inputs)
from flashtune.kernels.fp8 import attention_fp8, check_fp8_inputs
from flashtune.kernels.kvcache import attention_kvcache, check_kvcache_inputs
from flashtune.kernels.passes import attention_backward, attention_forward, resolve_configs
from flashtune.kernels.reference import reference_attention, reference_with_grads

__all__ = [
    "BwdConfig", "ConfigError", "FlashAttentionFunction", "FlashAttentionJvpFunction", "FwdConfig", "attention",
    "attention_backward", "attention_forward", "attention_fp8", "attention_jvp", "attention_kvcache",
    "attention_varlen", "check_fp8_inputs", "check_inputs", "check_kvcache_inputs",
    "check_varlen_inputs", "default_config", "padded_head_dim", "reference_attention", "reference_with_grads",
    "resolve_configs",
]
