"""The torch-free core every layer shares: model specs, split plans, trial results, errors, atomic I/O, policies."""

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.result import TrialResult
from pipeline.core.spec import ModelSpec

__all__ = ["ModelSpec", "PipesplitError", "SplitPlan", "SplitPoint", "TrialResult"]
