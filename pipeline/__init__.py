"""Real multi-process pipeline trials: model specs, split plans, candidates, the stage-worker pools."""

from pipeline.core import ModelSpec, PipesplitError, SplitPlan, SplitPoint, TrialResult

__all__ = ["ModelSpec", "PipesplitError", "SplitPlan", "SplitPoint", "TrialResult"]
