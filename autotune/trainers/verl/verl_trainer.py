"""verl 0.9.1 as a trainer (`--target verl`) and as the engine of a probe (`--engine verl`).

Its files are Hydra override lines and the launch scripts that pass them (autotune.formats.verl,
formats.launch_script). Its export is verl_overrides.txt, with the rollout engine sized beside the pick
(verl_export.py). A tuned copy is read back by Hydra and held to verl's own start-up rules on the job's GPUs.
Its probe runs `python -m verl.trainer.main_ppo` (autotune.probe.verl), its rollout engine included.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config.passes import Passes
from autotune.errors import UserError
from autotune.formats.verl import MINI_KEY, VERL_KIND
from autotune.probe.verl.install import VERL_VERSION
from autotune.trainers.base import Trainer

if TYPE_CHECKING:
    from autotune.config.knobs import ProbeConfig
    from autotune.formats.target import Target
    from autotune.trainers.export import Export, ExportJob

__all__ = ["VERL", "VerlTrainer"]


class VerlTrainer(Trainer):
    name = "verl"
    label = "verl"
    file_kind = VERL_KIND
    export_file = "verl_overrides.txt"
    keys_name = "verl's keys"
    file_description = f"Hydra overrides for verl {VERL_VERSION}"
    passes = Passes.VERL
    file_passes = Passes.VERL
    spans_nodes = True
    shards_states = True
    offloads_states = True
    token_budgets = True

    def defaults(self) -> dict[str, Any]:
        from autotune.formats.defaults import verl_defaults

        return verl_defaults()

    def unread_knobs(self) -> tuple[str, ...]:
        from autotune.formats.verl_table import not_verl_knobs

        return not_verl_knobs()

    def export(self, job: ExportJob) -> Export:
        from autotune.trainers.verl.verl_export import verl_export

        return verl_export(job)

    def launch_line(self, path: str, gpus: int, values: dict[str, Any], reward_model: str) -> str:
        from autotune.formats.verl_launch import verl_launch_line

        return verl_launch_line(path, values, reward_model)

    def mini_batch(self, target: Target) -> int:
        """verl counts the mini batch in prompts, × rollout.n samples; without one, the micro batches."""
        from autotune.formats.verl_schema import effective

        assert target.config is not None
        prompts = effective(MINI_KEY, target.overrides or {})
        if isinstance(prompts, int) and not isinstance(prompts, bool) and prompts > 0:
            return prompts * target.config.rollout_n
        return super().mini_batch(target)

    def nodes(self, target: Target) -> Any:
        from autotune.formats.verl_schema import effective

        return effective("trainer.nnodes", target.overrides or {})

    def tuned_changes(
        self, best: ProbeConfig, gpus: int, knobs: list[str], target: Target, text: str
    ) -> dict:
        from autotune.formats.tuned_values import verl_changes

        return dict(verl_changes(best, gpus, knobs, target.overrides or {}))

    def tuned_text(self, text: str, changes: dict[str, Any], target: Target, path: Path) -> str:
        from autotune.formats.launch_script import looks_like_launch_script
        from autotune.formats.tuned_file import tune_launch_script, tune_override_file

        if not changes:
            return text
        if not looks_like_launch_script(text):
            return tune_override_file(text, changes)
        called_in = target.call_file
        if called_in is not None and Path(called_in).resolve() != path.resolve():
            raise ValueError(
                f"the trainer is started in {called_in}, which the script sources: tune that file"
            )
        return tune_launch_script(text, changes, target.call_line or 1)

    def check_copy(
        self, source: Path, original: Target, path: Path, copy: Target, changes: dict[str, Any], gpus: int
    ) -> None:
        where = f"the tuned copy {path}"
        _check_values(original.overrides or {}, copy.overrides or {}, changes, where)
        _check_rules(original.overrides or {}, copy.overrides or {}, gpus, where)


def _check_values(
    original: dict[str, Any], values: dict[str, Any], changes: dict[str, Any], where: str
) -> None:
    """Every key of the original reads the same, but the changed ones, which read their new values."""
    from autotune.formats.verl import parse_overrides

    wanted = parse_overrides("".join(f"{key}={value}\n" for key, value in changes.items()), where)
    expected = {**original, **wanted}
    differing = sorted(key for key in expected.keys() | values.keys() if expected.get(key) != values.get(key))
    if differing:
        shown = ", ".join(
            f"{key}={values.get(key)!r} (wanted {expected.get(key)!r})" for key in differing[:3]
        )
        raise UserError(f"{where}: reads {shown}; it was not kept")


def _check_rules(original: dict[str, Any], values: dict[str, Any], gpus: int, where: str) -> None:
    """verl's own start-up rules on the job's GPUs: a value measured on a rehearsal (other GPUs, another
    batch) may not divide the real job's share of the batch. Rules the original already broke are its own."""
    from autotune.formats.verl import verl_rule_violations

    before = set(verl_rule_violations(original, gpus))
    broken = [rule for rule in verl_rule_violations(values, gpus) if rule not in before]
    if broken:
        raise UserError(f"{where}: verl would refuse it on the job's {gpus} GPU(s): {broken[0]}; not kept")


VERL = VerlTrainer()
