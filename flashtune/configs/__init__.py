"""Kernel launch configs as data: the config types, their validity rules and the search spaces.
Nothing here imports a kernel; the heuristic defaults live in flashtune.heuristics."""

from flashtune.configs.backward import BwdConfig, dkdv_split, split_work
from flashtune.configs.base import CONFIG_CLASSES, ConfigError, config_class, padded_head_dim
from flashtune.configs.forward import FwdConfig

__all__ = ["BwdConfig", "CONFIG_CLASSES", "ConfigError", "FwdConfig", "config_class", "dkdv_split",
           "padded_head_dim", "split_work"]
