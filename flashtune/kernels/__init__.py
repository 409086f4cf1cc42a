"""FlashAttention forward and backward kernels in Triton, launched with explicit configs."""

from flashtune.kernels.backward import attention_backward
from flashtune.kernels.config import BwdConfig, ConfigError, FwdConfig, default_config, padded_head_dim
from flashtune.kernels.forward import attention_forward
from flashtune.kernels.fp8 import attention_fp8, check_fp8_inputs
from flashtune.kernels.function import (FlashAttentionFunction, FlashAttentionJvpFunction, attention, attention_jvp,
                                        attention_varlen, check_inputs, check_varlen_inputs, resolve_configs)
from flashtune.kernels.kvcache import attention_kvcache, check_kvcache_inputs
from flashtune.kernels import ops  # noqa: F401  (registers torch.ops.flashtune.*)
from flashtune.kernels.reference import reference_attention, reference_with_grads

__all__ = [
    "BwdConfig", "ConfigError", "FlashAttentionFunction", "FlashAttentionJvpFunction", "FwdConfig", "attention",
    "attention_backward", "attention_forward", "attention_fp8", "attention_jvp", "attention_kvcache",
    "attention_varlen", "check_fp8_inputs", "check_inputs", "check_kvcache_inputs",
    "check_varlen_inputs", "default_config", "padded_head_dim", "reference_attention", "reference_with_grads",
    "resolve_configs",
]
