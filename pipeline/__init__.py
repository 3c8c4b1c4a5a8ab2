"""Real multi-process pipeline trials: model specs, split plans, candidates, the stage-worker pool."""

from pipeline.errors import PipesplitError
from pipeline.plan import SplitPlan, SplitPoint
from pipeline.result import TrialResult
from pipeline.spec import ModelSpec

__all__ = ["ModelSpec", "PipesplitError", "SplitPlan", "SplitPoint", "TrialResult"]
