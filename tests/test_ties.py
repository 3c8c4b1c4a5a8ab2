"""search.judging.ties: the tie rule on synthetic paired pipeline seconds, and how a tie is broken."""

import random

from hypothesis import given
from hypothesis import strategies as st

from search.judging.ties import MIN_PAIRS, Contender, break_tie, compare, paired_log_ratios


def rounds(base, spread, n_rounds=4, repeats=2, seed=0, drift=None):
    rng = random.Random(seed)
    return [[base * (drift[r] if drift else 1.0) * (1 + rng.uniform(-spread, spread)) for _ in range(repeats)]
            for r in range(n_rounds)]


def test_a_clear_winner_is_separated_even_when_the_machine_drifts():
    drift = [1.0, 1.15, 0.9, 1.2]  # the machine's drift slows both plans of a round alike
    a = rounds(1.0, 0.01, drift=drift, seed=1)
    b = rounds(1.1, 0.01, drift=drift, seed=2)
    c = compare(a, b)
    assert c.verdict == "a" and 0.88 < c.ratio < 0.93 and c.high < 1 and c.pairs == 8
    assert compare(b, a).verdict == "b"


def test_the_same_plan_measured_twice_is_a_tie():
    a = rounds(1.0, 0.05, seed=3)
    b = rounds(1.0, 0.05, seed=4)
    c = compare(a, b)
    assert c.verdict == "tie" and c.low <= 1 <= c.high


def test_one_noisy_outlier_does_not_flip_the_verdict():
    a = rounds(1.0, 0.005, seed=5)
    b = rounds(1.05, 0.005, seed=6)
    a[1][0] = 1.6  # one slow repeat of the faster plan
    assert compare(a, b).verdict == "a"


def test_too_few_pairs_cannot_separate_two_plans():
    assert compare([[1.0]], [[2.0]]).verdict == "tie" and MIN_PAIRS > 1
    assert compare([], [[1.0]]).pairs == 0


def test_a_round_one_plan_did_not_finish_is_left_out_of_the_pairs():
    assert len(paired_log_ratios([[1.0, 1.0], [], [1.0]], [[2.0, 2.0], [2.0], [2.0]])) == 3


@given(st.lists(st.lists(st.floats(0.1, 10), min_size=1, max_size=3), min_size=1, max_size=5),
       st.floats(0.5, 2.0))
def test_the_verdict_is_antisymmetric_and_the_interval_holds_the_ratio(a, scale):
    b = [[x * scale for x in r] for r in a]
    ab, ba = compare(a, b), compare(b, a)
    assert {ab.verdict, ba.verdict} in ({"tie"}, {"a", "b"})
    assert ab.low <= ab.ratio * (1 + 1e-9) and ab.ratio <= ab.high * (1 + 1e-9)


def test_a_tie_goes_to_the_lower_peak_then_the_fewer_chunks():
    a = Contender(trial=1, largest_peak_bytes=900 * 2**20, chunks=8, median_s=1.0)
    b = Contender(trial=2, largest_peak_bytes=800 * 2**20, chunks=16, median_s=1.01)
    win, why = break_tie([a, b])
    assert win.trial == 2 and "lower largest-stage peak memory (800 MiB against 900 MiB of trial 1)" in why
    c = Contender(trial=3, largest_peak_bytes=810 * 2**20, chunks=4, median_s=1.02)  # 10 MiB more: the same peak
    win, why = break_tie([a, b, c])
    assert win.trial == 3 and "peak memory within 2% and fewer chunks (4 against 16 of trial 2)" in why
    d = Contender(trial=4, largest_peak_bytes=805 * 2**20, chunks=4, median_s=1.00)
    win, why = break_tie([c, d])
    assert win.trial == 4 and "the same chunks, and the faster median (1 s against 1.02 s of trial 3)" in why
    assert break_tie([a])[1] == "no tie"
