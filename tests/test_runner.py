"""The search loop's own rules (the loop itself runs in test_optimize's real searches)."""


def test_short_models_are_repeated_more_up_to_a_cap():
    from search.study.runner import trial_repeats

    assert trial_repeats(2, serial_s=4.6, min_seconds=4.0) == 2  # DeiT-S batch 32: as asked
    assert trial_repeats(2, serial_s=0.5, min_seconds=4.0) == 8  # ResNet-50 batch 8: 4 s of serial model
    assert trial_repeats(2, serial_s=0.001, min_seconds=4.0) == 10  # a tiny model: at most 5x asked
    assert trial_repeats(3, serial_s=0.5, min_seconds=0) == 3  # turned off


def test_only_a_model_whose_run_takes_seconds_checks_on_its_first_timed_repeat():
    from search.study.runner import check_on_first_repeat

    assert check_on_first_repeat(4.6)  # DeiT-S batch 32: no cold first repeat measured, the check run saved
    assert not check_on_first_repeat(0.01)  # a tiny model: its first run is slower, and its check run cheap
