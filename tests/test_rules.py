import pytest

from autotune.config.knobs import ProbeConfig, parse_sets, resolve_mini_batch
from autotune.config.rules import config_findings, raise_for
from autotune.errors import UserError


def violations(config: ProbeConfig, world_size: int, cores: int) -> list[str]:
    return [finding.line for finding in config_findings(config, world_size, cores)]


def test_parse_sets_types_values():
    values = parse_sets(
        ["train_batch_size=32", "use_lora=true", "kl_coef=0.1", "log_prob_micro_batch_size=none"]
    )
    assert values == {
        "train_batch_size": 32,
        "use_lora": True,
        "kl_coef": 0.1,
        "log_prob_micro_batch_size": None,
    }


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        ("batch=4", "unknown knob"),
        ("micro_batch_size", "expected KNOB=VALUE"),
        ("micro_batch_size=four", "expected a whole number"),
        ("use_lora=maybe", "expected true or false"),
    ],
)
def test_parse_sets_rejects_bad_input(item, fragment):
    with pytest.raises(UserError, match=fragment):
        parse_sets([item])


def test_the_mini_batch_is_taken_as_the_spaces_take_it():
    values = parse_sets(["train_batch_size=16", "mini_batch_size=16", "micro_batch_size=4"])
    assert resolve_mini_batch(values, gpus=2) == {
        "train_batch_size": 16,
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 2,
    }
    assert resolve_mini_batch({"mini_batch_size": 8}, gpus=1) == {"gradient_accumulation_steps": 2}  # m=4
    assert resolve_mini_batch({"micro_batch_size": 2}, gpus=1) == {"micro_batch_size": 2}  # no M: unchanged


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        (
            {"mini_batch_size": 6, "micro_batch_size": 4},
            "mini_batch_size=6: not whole micro-batches .* mini_batch_size=8",
        ),
        ({"mini_batch_size": 0}, "mini_batch_size=0: .* e.g. mini_batch_size=4"),
        (
            {"mini_batch_size": 16, "micro_batch_size": 4, "gradient_accumulation_steps": 2},
            "gradient_accumulation_steps=2 disagrees with mini_batch_size=16",
        ),
    ],
)
def test_a_mini_batch_that_cannot_be_run_is_one_line(values, fragment):
    with pytest.raises(UserError, match=fragment) as error:
        resolve_mini_batch(values, gpus=1)
    assert "\n" not in str(error.value)


def test_issue_example_is_valid_on_one_and_two_ranks():
    sets = {
        "train_batch_size": 16,
        "rollout_batch_size": 8,
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 2,
    }
    for world in (1, 2):
        assert violations(ProbeConfig(**sets), world, cores=2) == []


def test_seed_kl_pitfall_train_300_rollout_128():
    problems = violations(
        ProbeConfig(
            train_batch_size=300, rollout_batch_size=128, micro_batch_size=4, gradient_accumulation_steps=1
        ),
        1,
        cores=8,
    )
    assert any(
        "not a multiple of rollout_batch_size=128" in p and "fix: train_batch_size: 384" in p
        for p in problems
    )


def test_mini_batch_must_divide_train_batch():
    # 4 micro × 2 accumulation × 2 GPUs = 16 does not divide 24
    problems = violations(
        ProbeConfig(
            train_batch_size=24, rollout_batch_size=8, micro_batch_size=4, gradient_accumulation_steps=2
        ),
        2,
        cores=2,
    )
    assert len(problems) == 1 and "=16" in problems[0] and "fix: train_batch_size: 32" in problems[0]


def test_rollout_must_split_into_whole_groups_per_rank():
    problems = violations(
        ProbeConfig(
            rollout_batch_size=6,
            train_batch_size=12,
            micro_batch_size=1,
            gradient_accumulation_steps=1,
            algorithm="grpo",
            rollout_n=4,
        ),
        1,
        cores=2,
    )
    assert any("gpus×rollout_n=1×4" in p for p in problems)


def test_grpo_needs_a_group():
    assert any("rollout_n=1" in p for p in violations(ProbeConfig(algorithm="grpo"), 1, cores=2))


def test_workers_above_physical_cores():
    problems = violations(ProbeConfig(num_rollout_workers=3), 1, cores=2)
    assert problems == [p for p in problems if "num_rollout_workers=3" in p] and problems


def test_forward_micro_batch_must_divide_rank_share():
    problems = violations(ProbeConfig(log_prob_micro_batch_size=3), 1, cores=2)
    assert any("log_prob_micro_batch_size=3" in p for p in problems)


def test_every_problem_of_a_config_is_one_line():
    with pytest.raises(UserError) as info:
        raise_for(config_findings(ProbeConfig(train_batch_size=20, num_rollout_workers=64), 1))
    message = str(info.value)
    assert "\n" not in message
    assert "train_batch_size=20" in message and "num_rollout_workers=64" in message


def test_non_positive_sizes():
    problems = violations(ProbeConfig(micro_batch_size=0, max_response_length=-1), 1, cores=2)
    fix = "a whole number from 1 to 2147483647"
    assert {
        f"micro_batch_size=0: must be a whole number >= 1; fix: micro_batch_size: {fix}",
        f"max_response_length=-1: must be a whole number >= 1; fix: max_response_length: {fix}",
    } <= set(problems)


def test_non_finite_and_out_of_range_numbers_are_findings():
    assert violations(ProbeConfig(kl_coef=float("nan")), 1, cores=2) == [
        "kl_coef=nan: must be a finite number; fix: kl_coef: a number from 0 to 100"
    ]
    (huge,) = violations(ProbeConfig(train_batch_size=2**40, rollout_batch_size=8), 1, cores=2)
    assert huge.startswith("train_batch_size=1099511627776: must be a whole number >= 1 and <= 2147483647")
