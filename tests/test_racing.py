import optuna
import pytest
from hypothesis import given
from hypothesis import strategies as st

from search.judging.racing import DEFAULT_CV, RacingPruner, band, noise_cv, verdict


def test_band_narrows_with_repeats():
    assert band(0.05, 1) == pytest.approx(0.10)
    assert band(0.05, 4) == pytest.approx(0.05)
    assert band(0.0, 9) == 0.01  # never narrower than 1 %


@given(st.floats(0.1, 10), st.floats(0.1, 10), st.floats(0.0, 0.3), st.integers(1, 20))
def test_verdict_is_consistent_with_the_band(value, best, cv, k):
    v = verdict(value, best, cv, k)
    b = band(cv, k)
    assert v == ("behind" if value < best * (1 - b) else "ahead" if value > best * (1 + b) else "contender")


def test_no_best_yet_is_a_contender():
    assert verdict(1.0, None, 0.05, 1) == "contender"
    assert verdict(float("nan"), 2.0, 0.05, 1) == "contender"


def test_noise_cv_needs_three_trials():
    assert noise_cv([[1.0, 1.1]]) == DEFAULT_CV
    assert noise_cv([[1.0, 1.0], [2.0, 2.0], [1.0, 1.0, 1.0]]) == 0.0


def _fake_objective(value_of):
    """A fake noisy plan: reports its speedup after each repeat, as the search's trials do."""
    def objective(trial):
        x = trial.suggest_categorical("plan", ["good", "bad"])
        values = []
        for k in range(1, 7):
            values.append(value_of[x])
            trial.set_user_attr("speedups", list(values))
            trial.report(sum(values) / len(values), step=k)
            if trial.should_prune():
                trial.set_user_attr("repeats", k)
                raise optuna.TrialPruned()
        trial.set_user_attr("repeats", 6)
        return sum(values) / len(values)
    return objective


def test_a_clearly_worse_plan_stops_after_one_repeat():
    study = optuna.create_study(direction="maximize", pruner=RacingPruner())
    study.enqueue_trial({"plan": "good"})
    study.enqueue_trial({"plan": "bad"})
    study.optimize(_fake_objective({"good": 2.0, "bad": 1.5}), n_trials=2)
    good, bad = study.trials
    assert good.state == optuna.trial.TrialState.COMPLETE and good.user_attrs["repeats"] == 6
    assert bad.state == optuna.trial.TrialState.PRUNED and bad.user_attrs["repeats"] == 1
    assert bad.value == 1.5  # a pruned trial keeps its measured speedup so far, nothing predicted


def test_a_close_plan_is_not_pruned():
    study = optuna.create_study(direction="maximize", pruner=RacingPruner())
    study.enqueue_trial({"plan": "good"})
    study.enqueue_trial({"plan": "bad"})
    study.optimize(_fake_objective({"good": 2.0, "bad": 1.95}), n_trials=2)
    assert study.trials[1].state == optuna.trial.TrialState.COMPLETE
