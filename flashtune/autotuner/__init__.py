"""The autotuner: an Optuna search per tuning key over configs that pass a correctness check."""

from flashtune.autotuner.search import KeyResult, Progress, SearchSummary, build_keys, search, study_name

__all__ = ["KeyResult", "Progress", "SearchSummary", "build_keys", "search", "study_name"]
