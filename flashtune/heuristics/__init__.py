"""The heuristic defaults: band rules, per-architecture tables as data files, default selection."""

from flashtune.heuristics.bands import is_long, is_mid, long_bounds
from flashtune.heuristics.defaults import default_config, family_defaults, portfolio, triton_default
from flashtune.heuristics.tables import HEURISTICS

__all__ = ["HEURISTICS", "default_config", "family_defaults", "is_long", "is_mid", "long_bounds", "portfolio",
           "triton_default"]
