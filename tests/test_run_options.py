import io
from pathlib import Path

import pytest
from rich.console import Console

from autotune.cli import build_parser, main
from autotune.errors import UserError
from autotune.memory.budget import Budget
from autotune.run.prepare import (
    RunOptions,
    check_floor,
    check_offload,
    default_study_name,
    hold_unexported,
    parse_duration,
    resolve_space,
)
from autotune.space.loading import load_space, space_from_dict, with_settings
from autotune.space.schema import shipped_dir
from autotune.units import GIB


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("8h", 28800), ("90m", 5400), ("1h30m", 5400), ("45s", 45), ("120", 120), ("1d", 86400), ("0.5h", 1800)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "8 hours", "h", "1h and 5m"])
def test_bad_durations(text):
    with pytest.raises(UserError, match="--time-budget"):
        parse_duration(text)


def test_study_name_from_a_model_directory():
    assert (
        default_study_name("cpu-tiny", "/models/My Model/", 2, "0a1b2c3d")
        == "cpu-tiny-My-Model-2gpu-0a1b2c3d"
    )


# --- the recipe flags: --train-batch-size, --mini-batch-size, --tune --------------------------------------


def resolved(tmp_path=None, text: str | None = None, **flags):
    """The space `autotune run` would search, with these flags (cpu-tiny, or the YAML `text`)."""
    space = "cpu-tiny"
    if text is not None:
        path = tmp_path / "space.yaml"
        path.write_text(text, encoding="utf-8")
        space = str(path)
    return resolve_space(RunOptions(space=space, **flags), Console(file=io.StringIO()))[0]


RANGED = """
model: tiny-llama
knobs:
  train_batch_size: {min: 16, max: 64}
  mini_batch_size: 8
  rollout_batch_size: 8
  micro_batch_size: {min: 1, max: 4}
  num_rollout_workers: 1
  max_prompt_length: 16
  max_response_length: 16
"""


def test_recipe_flags_fix_the_train_and_mini_batch():
    space = resolved(train_batch_size=64, mini_batch_size=16)
    assert (space.recipe()["train_batch_size"], space.recipe()["mini_batch_size"]) == (64, 16)
    assert all(c.train_batch_size == 64 for c in space.grid())
    # the plan stores the space as resolved: `autotune worker` searches the same recipe
    assert space.raw["knobs"]["train_batch_size"] == 64 and space.raw["knobs"]["mini_batch_size"] == 16


def test_a_flag_fixes_a_range_the_file_forgot_to_tune(tmp_path):
    with pytest.raises(UserError, match="train_batch_size is part of the recipe"):
        resolved(tmp_path, RANGED)
    assert resolved(tmp_path, RANGED, train_batch_size=32).recipe()["train_batch_size"] == 32


def test_tune_opts_a_ranged_recipe_knob_into_the_search(tmp_path):
    space = resolved(tmp_path, RANGED, tune=["train_batch_size"])
    assert space.tune == ("train_batch_size",)
    assert space.recipe()["train_batch_size"] == [16, 32, 64]
    assert space.raw["tune"] == ["train_batch_size"]
    # a file that tunes a knob, and a flag that fixes it: fixed wins, and the knob leaves tune
    tuned = RANGED + "tune: [train_batch_size]\n"
    assert resolved(tmp_path, tuned, train_batch_size=16).tune == ()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            {"train_batch_size": 48},
            "--train-batch-size 48: must be gpus×rollout_n×2^k = 1×2^k, e.g. 32 or 64",
        ),
        ({"mini_batch_size": 3}, "--mini-batch-size 3: must be gpus×rollout_n×2^k = 1×2^k, e.g. 2 or 4"),
        (
            {"tune": ["train_batch_size"]},
            "--tune train_batch_size: {source} fixes train_batch_size=16, and --tune cannot invent a range: "
            "give train_batch_size a range {{min: .., max: ..}} in a copy of the space file",
        ),
        (
            {"tune": ["mini_batch_size"], "mini_batch_size": 8},
            "--mini-batch-size 8 fixes mini_batch_size, and --tune mini_batch_size would search it: give one "
            "of them",
        ),
        (
            {"mini_batch_size": 64},
            "{source}: mini_batch_size.min=64: exceeds train_batch_size.max=16: T must be a whole number of "
            "mini-batches",
        ),
    ],
)
def test_a_wrong_recipe_flag_is_one_line(flags, message):
    source = str(shipped_dir() / "cpu-tiny.yaml")
    with pytest.raises(UserError) as info:
        resolved(**flags)
    assert str(info.value) == message.format(source=source)


def test_the_command_line_refuses_a_non_recipe_knob_in_one_line(capsys):
    for argv, fragment in (
        (["run", "--tune", "micro_batch_size"], "'micro_batch_size' is not a recipe knob (a system knob"),
        (["run", "--tune", "train_batch_size,lengths"], "'lengths' is not a recipe knob (unknown)"),
        (["run", "--train-batch-size", "0"], "argument --train-batch-size: must be a whole number >= 1"),
        (["run", "--mini-batch-size", "nan"], "argument --mini-batch-size: expected a whole number"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and fragment in err[0], err


def test_help_says_what_the_recipe_flags_do(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--train-batch-size N fix the recipe's train batch" in text
    assert "--mini-batch-size N fix the recipe's mini batch (samples per optimizer step" in text
    assert "--tune KNOB[,KNOB] also search these recipe knobs" in text
    args = build_parser().parse_args(["run", "--tune", "train_batch_size", "--tune", "max_prompt_length"])
    assert args.tune == ["train_batch_size", "max_prompt_length"]


# --- what `run` refuses before the first probe: offload on CPU, a budget below the smallest holding ---------


def test_offload_choices_are_refused_on_cpu_in_one_line():
    space = load_space("seed-4xa100-40g-13b-fsdp")
    with pytest.raises(UserError) as info:
        check_offload(space, "cpu")
    assert str(info.value) == (
        f"{space.source}: knobs.offload_policy may be true, but offload_policy=true on CPU: offload moves "
        f"the states from a GPU to the CPU, and there is no GPU; fix: offload_policy: false (offload is "
        f"measured on CUDA)"
    )
    check_offload(space, "cuda")  # measured there
    check_offload(load_space("cpu-tiny"), "cpu")  # no offload: nothing to refuse


def floor_model(space, device: str):
    from autotune.memory.architecture import Architecture
    from autotune.memory.calibration import MemoryModel
    from autotune.models.catalog import resolve_model, resolve_reward_model

    arch = Architecture.from_specs(resolve_model(space.model), resolve_reward_model(space.reward_model))
    return MemoryModel(arch, space.gpus, device)


def test_the_floor_is_the_smallest_holding_the_space_allows():
    space = load_space("seed-4xa100-40g-13b-fsdp")
    budget = Budget(40 * GIB, 0.10)
    check_floor(
        space, floor_model(space, "cuda"), budget, 40
    )  # offload_policy holds 13B's states on the host
    without_offload = with_settings(space, knobs={**space.raw["knobs"], "offload_policy": False})
    with pytest.raises(UserError) as info:
        check_floor(without_offload, floor_model(without_offload, "cuda"), budget, 40)
    message = str(info.value)
    assert "about 97.9 GiB per rank even held as full_shard over 4 rank(s)" in message  # not 507.6 replicated
    assert (
        "offload (`offload_policy: true` in the space's knobs, on CUDA)" in message
        and len(message.splitlines()) == 1
    )
    replicated = with_settings(
        without_offload, knobs={**without_offload.raw["knobs"], "sharding": "replicate"}
    )
    with pytest.raises(
        UserError, match=r"about 507\.6 GiB per rank held replicated .*`sharding: full_shard`.* \(--gpus\)"
    ):
        check_floor(replicated, floor_model(replicated, "cuda"), budget, 40)


def test_a_gpu_job_without_a_gpu_says_so_and_what_works_here(capsys, monkeypatch, tmp_path):
    """The mission's own command on a machine without a GPU: one line that says no GPU is visible, the CPU
    ranks auto would use, and commands that work here, each a real flag (exit 2, before any probe)."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    code = main(["run", "--model", "llama-2-7b", "--gpus", "2", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: no GPU is visible here, so --device auto would run 2 CPU rank(s)")
    for works in ("autotune check FILE --gpu a100-80g", "autotune run --space cpu-tiny", "--device cpu"):
        assert works in err
    assert not any(tmp_path.iterdir())  # nothing started


def test_data_fits_the_recipe_lengths_and_a_collapsed_tuned_length_is_no_longer_tuned(tmp_path):
    from types import SimpleNamespace

    from autotune.run.job_data import fit_space_to_data

    lengths = SimpleNamespace(suggested_prompt_length=40, suggested_response_length=100)
    space, notes = fit_space_to_data(load_space("cpu-tiny"), lengths)
    assert (space.recipe()["max_prompt_length"], space.recipe()["max_response_length"]) == (40, 100)
    assert len(notes) == 2
    text = RANGED.replace("max_response_length: 16", "max_response_length: {min: 8, max: 64}")
    tuned = resolved(tmp_path, text, train_batch_size=32, tune=["max_response_length"])
    assert tuned.tune == ("max_response_length",)
    fitted, _ = fit_space_to_data(tuned, lengths)  # 100 is above every tuned value: one value is left
    assert fitted.tune == () and fitted.recipe()["max_response_length"] == 100
    fitted, _ = fit_space_to_data(
        tuned, SimpleNamespace(suggested_prompt_length=16, suggested_response_length=24)
    )
    assert fitted.tune == ("max_response_length",) and fitted.recipe()["max_response_length"] == [24, 32, 64]


def test_run_says_why_a_hand_made_config_is_not_enqueued():
    from autotune.run.main import unfit_seed_lines

    space = load_space("seed-4xa100-40g-13b-fsdp", cores=2)
    assert unfit_seed_lines(space, []) == [
        'hand-made config "the article\'s hand-made 13B config (4×A100 40G, FSDP)" is not enqueued: '
        "num_rollout_workers=6: exceeds the 2 physical cores here"
    ]
    sixteen = with_settings(load_space("seed-2xa100-80g-7b-lora", cores=64), gpus=16)
    assert (
        sixteen.seed_configs == () and "micro_batch_size×gpus=32×16=512" in unfit_seed_lines(sixteen, [])[0]
    )


def _gain_space():
    return load_space(str(Path(__file__).parent / "data" / "gain_space.yaml"), cores=2)


def test_a_knob_verl_does_not_read_is_held_at_a_hand_made_configs_value():
    """gain_space searches the rollout batch (8 or 16); its hand-made configs use 8 and 16: the study holds
    8, the first one's, and probes the second at 8 too, as verl would run it (verl has no rollout batch)."""
    out = io.StringIO()
    space = hold_unexported(_gain_space(), False, Console(file=out, width=300))
    assert space.knob("rollout_batch_size").values() == (8,) and not space.knob("rollout_batch_size").searched
    assert [seed.config.rollout_batch_size for seed in space.seed_configs] == [8, 8]
    assert [seed.name for seed in space.seed_configs] == ["hand-made slow corner", "hand-made large batches"]
    said = out.getvalue()
    assert said.startswith("note: rollout_batch_size held at 8 (a hand-made config's): verl has no such knob")
    assert "--search-unexported searches it anyway; hand-made 'hand-made large batches' probed at 8" in said


def test_search_unexported_searches_it_and_a_space_without_hand_made_configs_holds_the_largest():
    space = _gain_space()
    assert hold_unexported(space, True, Console(file=io.StringIO())) is space
    bare = space_from_dict({**space.raw, "seed_configs": []}, source="bare", cores=2)
    out = io.StringIO()
    assert hold_unexported(bare, False, Console(file=out, width=300)).knob("rollout_batch_size").values() == (
        16,
    )
    assert "held at 16 (the space's largest)" in out.getvalue()
    run_help = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "--search-unexported" in run_help
