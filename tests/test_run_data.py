"""`autotune run --data`: the data's length suggestions bound the length knobs; probes use its prompts."""

import json

import optuna
import pytest

from tests.conftest import TINY_GRID, run_cli

pytestmark = pytest.mark.e2e


def test_run_with_data_bounds_lengths_and_probes_its_prompts(tmp_path):
    data = tmp_path / "data.jsonl"
    words = "the policy answers each question with a short and careful response about numbers".split()
    with data.open("w") as sink:
        for i in range(200):
            prompt = " ".join(words[(i + k) % len(words)] for k in range(10 + i % 12))
            response = " ".join(words[(i * 3 + k) % len(words)] for k in range(20 + i % 20))
            sink.write(json.dumps({"prompt": prompt, "response": response}) + "\n")
    lengths = json.loads(run_cli("lengths", str(data), "--model", "tiny-llama", "--json").stdout)
    suggested = lengths["suggested"]

    proc = run_cli(
        "run",
        "--gain-rounds",  # the back-to-back gain has its own tests (test_interrupt_e2e, test_live_and_gain)
        "0",
        "--space",
        str(TINY_GRID),
        "--trials",
        "2",
        "--device",
        "cpu",
        "--out",
        str(tmp_path),
        "--study",
        "with-data",
        "--data",
        str(data),
        "--memory-budget",
        "4",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"max_response_length >= {suggested['max_response_length']}" in proc.stdout
    study = optuna.load_study(
        study_name="with-data", storage=f"sqlite:///{tmp_path / 'with-data' / 'study.db'}"
    )
    configs = [t.user_attrs["config"] for t in study.trials if t.user_attrs.get("config")]
    assert configs and all(c["max_prompt_length"] >= suggested["max_prompt_length"] for c in configs)
    assert all(c["max_response_length"] >= suggested["max_response_length"] for c in configs)
    assert any(t.user_attrs.get("status") == "ok" for t in study.trials)
    prompts = json.loads((tmp_path / "with-data" / "data_prompts.json").read_text())
    assert len(prompts) == 200 and prompts[0].startswith("the policy")
