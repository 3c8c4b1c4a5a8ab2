"""The confirmation round as the study keeps it: medians, the best plan, PiPPy's row, JSON round trip."""

import math

from search.judging.confirm import Confirmation, Confirmed


def row(trial, source, speedups):
    return Confirmed(trial=trial, source=source, split_points=("blocks.2",), chunks=4, search_value=1.5,
                     values=tuple(speedups))


def test_the_best_is_the_highest_median_and_pippy_is_found_in_merged_sources():
    c = Confirmation(rounds=2, repeats_per_run=2, plans=(row(3, "tpe", [1.5, 1.7, 1.6]),
                                                         row(0, "pippy-equal-size+uniform", [1.2, 1.3]),
                                                         row(5, "costmodel-optimum", [])))
    assert c.best_trial == 3 and c.row(3).median == 1.6 and c.row(3).spread == (1.5, 1.7)
    assert c.pippy.trial == 0 and math.isnan(c.row(5).median)
    again = Confirmation.from_dict(c.to_dict())
    assert again == c and again.to_dict()["best_trial"] == 3
    assert Confirmation.from_dict(None) is None


def test_a_round_kept_before_the_metric_was_named_reads_as_speedups():
    old = {"rounds": 1, "repeats_per_run": 2, "plans": [{"trial": 4, "source": "tpe", "split_points": ["b.1"],
                                                          "chunks": 2, "search_speedup": 1.4, "speedups": [1.5, 1.7],
                                                          "predicted_speedup": 1.6}]}
    c = Confirmation.from_dict(old)
    assert c.metric == "speedup" and c.row(4).values == (1.5, 1.7) and c.row(4).predicted == 1.6
    assert c.row(4).search_value == 1.4 and c.best_trial == 4
    assert Confirmation.from_dict(c.to_dict()) == c


def test_each_frameworks_default_rule_is_found_and_compared_with_the_best():
    from search.outputs.summary import frameworks_summary

    c = Confirmation(rounds=2, repeats_per_run=2, plans=(row(3, "tpe", [1.5, 1.7, 1.6]),
                                                         row(1, "torchtitan+megatron", [1.2, 1.3]),
                                                         row(2, "deepspeed-parameters+uniform", [0.8, 0.8])))
    assert {k: v.trial for k, v in c.frameworks.items()} == {"torchtitan": 1, "megatron": 1, "deepspeed-parameters": 2}
    text, data = frameworks_summary(c, "speedup", {"torchtitan-w2": "not installed"})
    assert data["deepspeed-parameters"]["best_over_it"] == 2.0 and data["torchtitan"]["speedup_spread"] == [1.2, 1.3]
    assert "1.28x the plan of torchtitan, megatron (1.25, spread 1.20-1.30)" in text
    assert "2.00x the plan of deepspeed-parameters" in text and "torchtitan-w2 (not installed)" in text
    same = Confirmation(rounds=1, repeats_per_run=2, plans=(row(3, "costmodel-optimum+torchtitan", [1.5, 1.6]),))
    assert "is the default plan of torchtitan itself" in frameworks_summary(same, "speedup")[0]


def timed(trial, seconds, chunks=4, peak=None, source="tpe"):
    return Confirmed(trial=trial, source=source, split_points=("blocks.2",), chunks=chunks, search_value=1.5,
                     values=tuple(2.0 / x for r in seconds for x in r), round_s=tuple(tuple(r) for r in seconds),
                     peak_bytes=peak)


def test_the_fastest_by_paired_seconds_is_declared_and_the_others_are_separated_or_tied():
    from search.judging.confirm import decide

    fast = timed(1, [[0.99, 1.00], [1.19, 1.20], [0.89, 0.90]])  # the machine drifts between rounds
    same = timed(2, [[1.00, 0.99], [1.21, 1.19], [0.90, 0.92]])
    slow = timed(3, [[1.10, 1.11], [1.32, 1.33], [0.99, 1.00]])
    best, tied, comps = decide((fast, slow, same))
    assert best == 1 and tied == (2,)
    assert comps[3].verdict == "b" and 1.08 < comps[3].ratio < 1.12 and comps[2].verdict == "tie"


def test_a_tie_is_said_with_its_rule_and_how_it_was_broken_and_survives_the_study():
    from search.judging.ties import compare

    a = timed(1, [[1.0, 1.0], [1.0, 1.01]], chunks=8, peak=900 * 2**20)
    b = timed(2, [[1.0, 1.01], [1.0, 1.0]], chunks=4, peak=800 * 2**20)
    c = Confirmation(rounds=2, repeats_per_run=2, plans=(a, b), declared=2, tied_with=(1,),
                     tie_reason="tie broken in favour of trial 2 by the lower largest-stage peak memory (800 MiB "
                     "against 900 MiB of trial 1)", comparisons={2: compare(b.round_s, a.round_s).to_dict()},
                     extra_rounds=1)
    assert c.best_trial == 2 and [r.trial for r in c.tied] == [1]
    text = c.verdict()
    assert text.startswith("Tied: trials 1, 2 cannot be separated after 1 more round of them (paired pipeline seconds, "
                           "95% bootstrap interval") and "The tie broken in favour of trial 2" in text
    assert text.endswith("4 pairs of runs separate no two plans (the rule needs 6): more --confirm-rounds or --repeats "
                         "give it more.")
    assert Confirmation.from_dict(c.to_dict()) == c
    alone = Confirmation(rounds=1, repeats_per_run=2, plans=(a,), declared=1)
    assert alone.verdict() == "Trial 1 is the only plan the round measured."
