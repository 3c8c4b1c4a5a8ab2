"""search.outputs.summary: the summary table, on rows as the study gives them (no trials run)."""

from search.outputs.summary import summary_table


def test_summary_table_marks_the_best_and_a_failed_reference():
    rows = [{"role": "BEST", "source": "sampler", "trial": 7, "split_points": ["blocks.2"], "chunks": 4, "predicted": 1.8,
             "measured": 1.7, "confirmed": 1.65, "failed": None, "schedule": "Interleaved1F1B/V2", "peak_mib": [310, 290]},
            {"role": "reference", "source": "pippy-equal-size", "trial": 0, "split_points": ["blocks.1.mlp.fc1"],
             "chunks": 2, "predicted": None, "measured": None, "confirmed": None, "failed": "rank 1 failed mid-trial"}]
    lines = summary_table(rows).splitlines()
    assert lines[2] == "| BEST | sampler | 7 | blocks.2 | 4 | Interleaved1F1B/V2 | 1.80 | 1.70 | 1.65 | 310, 290 |"
    assert lines[3].startswith("| reference | pippy-equal-size | 0 | blocks.1.mlp.fc1 | 2 | GPipe | - | failed: rank 1")


def test_a_search_that_measured_fewer_trials_than_asked_says_why():
    from search.outputs.summary import budget_line

    counts = {"stored": 124, "measured": 4, "seeds": 4, "raced_out": 0, "repeats": 9, "pruned": 100, "infeasible": 18,
              "duplicates": 2, "skipped": 0, "space": 300}
    line = budget_line(counts, asked=8)
    assert line.startswith("4 measured trials (4 seeds, 0 the sampler's own) of 8 asked for, 9 timed repeats; "
                           "124 trials stored in all, from a space of 300 plans.")
    assert "100 were pruned by the cost model" in line and "18 were infeasible" in line and "--no-prune" in line
    assert "stopped short" not in budget_line(counts | {"measured": 8, "seeds": 4}, asked=8)


def test_a_failed_trial_is_counted_and_named_apart_from_the_measured_ones():
    from search.outputs.summary import budget_line

    counts = {"stored": 12, "measured": 11, "failed": 1, "seeds": 3, "raced_out": 4, "repeats": 20, "pruned": 0,
              "infeasible": 0, "duplicates": 0, "skipped": 0, "space": 84}
    why = "stage worker rank 1 (pid 4242) died (signal 9)"
    line = budget_line(counts, asked=12, failures=[(5, why)])
    assert line.startswith(f"11 measured trials (3 seeds, 8 the sampler's own, 4 of them raced out early) and 1 failed "
                           f"(trial 5: {why}) of 12 asked for")
    assert "stopped short" not in line


def test_the_budget_line_names_the_repeat_budget_and_a_small_space():
    from search.outputs.summary import budget_line

    counts = {"stored": 10, "measured": 6, "seeds": 3, "raced_out": 2, "repeats": 20, "pruned": 0, "infeasible": 0,
              "duplicates": 0, "skipped": 0, "space": 6}
    line = budget_line(counts, asked=40)
    assert "2 of them raced out early" in line and "The space holds only 6 plans" in line
    line = budget_line(counts, asked=40, budget_repeats=20)
    assert "of a budget of 20" in line and "repeat budget was spent" in line
    # a space whose plans were predicted over the memory limit: every one has its trial, none is "short"
    over = counts | {"measured": 1, "seeds": 1, "predicted_over": 6}
    line = budget_line(over, asked=2)
    assert "6 predicted over --device-memory and not run): every one was tried, each once" in line
    assert "stopped short" not in line
    # a big model whose budget leaves few plans: the rest were predicted over and never built
    line = budget_line(counts | {"measured": 4, "seeds": 2, "unrun_over_memory": 3416}, asked=6)
    assert "every plan left was predicted over --device-memory: the 3416 plans without a trial" in line
    assert "stopped short" not in line


def test_every_figure_keeps_its_spread_and_a_speedup_over_the_ceiling_is_flagged():
    rows = [{"role": "BEST", "source": "sampler", "trial": 7, "split_points": ["blocks.2"], "chunks": 4, "predicted": 1.8,
             "measured": 2.05, "measured_spread": [1.9, 2.2], "confirmed": 1.95, "confirmed_spread": [1.8, 2.1],
             "failed": None},
            {"role": "TIED", "source": "sampler", "trial": 9, "split_points": ["blocks.3"], "chunks": 2, "predicted": 1.7,
             "measured": 1.9, "confirmed": 1.93, "confirmed_spread": [1.85, 2.0], "failed": None}]
    lines = summary_table(rows, ceiling=2.0).splitlines()
    assert "| 2.05 (1.90-2.20) above the 2.00x ceiling: noise | 1.95 (1.80-2.10) |" in lines[2]
    assert lines[3].startswith("| TIED | sampler | 9 |") and "| 1.93 (1.85-2.00) |" in lines[3]
    assert "ceiling" not in summary_table(rows, metric="throughput", ceiling=2.0)
