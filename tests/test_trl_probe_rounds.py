"""Which rounds of a TRL probe set the peak and which are timed (autotune.probe.trl_backend.Rounds)."""

from __future__ import annotations

from autotune.probe.trl_backend import Rounds


def test_on_cpu_the_warm_up_and_one_more_round_set_the_peak_before_the_timed_rounds():
    rounds = Rounds(warmup=1, iterations=2, steps_per_round=2, cpu=True)
    assert rounds.untimed == 2 and rounds.total == 4  # the second round holds Adam's states
    assert rounds.per_round([1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]) == ([2.0, 4.0], [6.0, 8.0])


def test_on_cuda_only_the_warm_up_is_untimed():
    rounds = Rounds(warmup=1, iterations=2, steps_per_round=1, cpu=False)
    assert rounds.untimed == 1 and rounds.total == 3
    assert rounds.per_round([1.0, 2.0, 3.0]) == ([1.0], [2.0, 3.0])


def test_on_cpu_without_a_warm_up_two_rounds_still_set_the_peak():
    rounds = Rounds(warmup=0, iterations=2, steps_per_round=1, cpu=True)
    assert rounds.untimed == 2 and rounds.total == 4
