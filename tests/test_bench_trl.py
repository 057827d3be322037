"""bench/trl.py's arithmetic: when a search pays for itself against the manual path's relaunches."""

from __future__ import annotations

import pytest

from bench.trl import break_even


def test_the_search_pays_for_itself_after_the_minutes_its_speed_wins_back():
    # 4.5 min of search against 0.36 min of failed launches, at 1.07x: each minute of training at the
    # manual path's speed takes 1/1.07 min with the pick, so 4.14 min come back after 4.14 / (1 - 1/1.07).
    assert break_even(4.5, 0.36, 1.07) == pytest.approx(4.14 / (1 - 1 / 1.07))
    assert break_even(0.2, 0.36, 1.07) == 0.0  # cheaper than the failed launches: paid at once


def test_a_pick_that_is_not_faster_never_pays():
    assert break_even(4.5, 0.36, 1.0) is None and break_even(4.5, 0.36, 0.95) is None


def test_the_pick_is_the_manual_paths_config_where_it_keeps_trls_defaults_beside_the_halved_micro_batch():
    from bench.trl import same_config

    manual = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "use_cpu": True}
    pick = {**manual, "activation_checkpointing": True, "dataloader_num_workers": 0}
    assert same_config(pick, manual)
    assert not same_config({**pick, "activation_checkpointing": False}, manual)
    assert not same_config(
        {**pick, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 8}, manual
    )
