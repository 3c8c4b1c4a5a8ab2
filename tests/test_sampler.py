import optuna

from search.plans.sampler import PlanSampler, trial_point, tried_points
from search.plans.space import PlanPoint, PlanSpace
from search.trials.coordination import MEASURED


def test_the_sampler_proposes_only_valid_new_plans_into_a_real_study():
    sp = PlanSpace(names=tuple(f"blocks.{i}" for i in range(12)), stages=4, chunks=(2, 4, 8))
    model = lambda p: (1.0 + 0.01 * p.chunks) / max(sp.stage_blocks(p))  # noqa: E731
    sampler = PlanSampler(sp, model, [PlanPoint(cuts=(3, 6, 9), chunks=8)], seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial(sp.encode(PlanPoint(cuts=(1, 2, 3), chunks=2)))  # an enqueued seed keeps its params

    def objective(trial):
        params = {k: trial.suggest_categorical(k, list(v)) for k, v in sp.choices().items()}
        p = sp.decode(params)  # raises on an invalid plan: the test fails
        trial.set_user_attr(MEASURED, True)
        return model(p)

    study.optimize(objective, n_trials=25)
    measured, seen = tried_points(study, sp)
    assert len(seen) == 25 and len(measured) == 25  # 25 distinct valid plans, no duplicates
    assert sp.decode(study.trials[0].params) == PlanPoint(cuts=(1, 2, 3), chunks=2)
    assert sp.decode(study.trials[1].params) == PlanPoint(cuts=(3, 6, 9), chunks=8)  # the model's best next
    assert study.best_value == model(PlanPoint(cuts=(3, 6, 9), chunks=8))
    assert study.trials[5].params["cut_1"].startswith("blocks.")  # what the dashboard shows: module names


def test_an_exhausted_space_is_flagged():
    sp = PlanSpace(names=("a", "b", "c"), stages=2, chunks=(1,))
    sampler = PlanSampler(sp, lambda p: 1.0, [], seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)

    def objective(trial):
        sp.decode({k: trial.suggest_categorical(k, list(v)) for k, v in sp.choices().items()})
        trial.set_user_attr(MEASURED, True)
        return 1.0

    study.optimize(objective, n_trials=3)
    assert sampler.exhausted


def test_a_seed_whose_fixed_plan_lies_in_the_space_counts_as_tried_and_untried_counts_down():
    sp = PlanSpace(names=("a", "b", "c"), stages=2, chunks=(1, 2))
    sampler = PlanSampler(sp, lambda p: 1.0, [], seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    assert sampler.untried(study) == sp.size == 4
    fixed = {"split_points": [{"fqn": "b", "kind": "BEGINNING"}], "chunks": 2, "schedule": "GPipe"}
    mid_block = {"split_points": [{"fqn": "b.fc", "kind": "BEGINNING"}], "chunks": 2, "schedule": "GPipe"}
    study.enqueue_trial({}, user_attrs={"fixed_plan": fixed})
    study.enqueue_trial({}, user_attrs={"fixed_plan": mid_block})
    assert [trial_point(t, sp) for t in study.trials] == [PlanPoint(cuts=(1,), chunks=2), None]
    assert sampler.untried(study) == 3

    def objective(trial):
        if not trial.user_attrs.get("fixed_plan"):
            sp.decode({k: trial.suggest_categorical(k, list(v)) for k, v in sp.choices().items()})
        return 1.0

    study.optimize(objective, n_trials=5)
    assert sampler.untried(study) == 0
    _, seen = tried_points(study, sp)
    assert len(seen) == 4  # the sampler never proposed the seed's plan again
