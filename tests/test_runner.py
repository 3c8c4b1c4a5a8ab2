"""The search loop's own rules (the loop itself runs in test_optimize's real searches)."""


def test_short_models_are_repeated_more_up_to_a_cap():
    from search.runner import trial_repeats

    assert trial_repeats(2, serial_s=4.6, min_seconds=4.0) == 2  # DeiT-S batch 32: as asked
    assert trial_repeats(2, serial_s=0.5, min_seconds=4.0) == 8  # ResNet-50 batch 8: 4 s of serial model
    assert trial_repeats(2, serial_s=0.001, min_seconds=4.0) == 10  # a tiny model: at most 5x asked
    assert trial_repeats(3, serial_s=0.5, min_seconds=0) == 3  # turned off
