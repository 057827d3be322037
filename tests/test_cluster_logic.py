"""--ray and --nodes without a cluster: the flags, what a cluster must hold, how a rank's lost actor is
explained and recorded, and what verl is handed. (The cluster itself, two nodes on this machine:
test_ray.py.)"""

from __future__ import annotations

import re
import sys
import time
import types
from pathlib import Path

import optuna
import pytest

from autotune.cli import main
from autotune.config.knobs import ProbeConfig
from autotune.errors import UserError
from autotune.formats.verl import verl_overrides
from autotune.probe.cluster.connect import Cluster, Node, check_fits, check_flags, cluster_device
from autotune.probe.cluster.placement import bundles
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.probe.verl.verl_run import verl_run
from autotune.run.prepare import RunOptions, command_line_space
from autotune.run.slots import oversubscribed, plan_slots
from autotune.status import Status
from autotune.study.plan import StudyPlan
from autotune.study.trials import trial_status
from tests.test_study import FakeProbe, make_tuner

CONFIG = ProbeConfig(
    train_batch_size=16,
    rollout_batch_size=8,
    micro_batch_size=2,
    gradient_accumulation_steps=4,
    max_prompt_length=16,
    max_response_length=16,
)


def one_line_exit_2(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# --- bad input, before any probe --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["probe", "--nodes", "0"], "argument --nodes: must be a whole number >= 1"),
        (["probe", "--nodes", "2"], "--nodes 2: a probe over several machines runs on a Ray cluster"),
        (["run", "--nodes", "2", "--space", "cpu-tiny"], "add --ray ADDRESS"),
        (["probe", "--ray", "127.0.0.1:1"], "--ray 127.0.0.1:1: nobody answers at 127.0.0.1:1"),
        (["probe", "--ray", "head-without-port"], "expected HOST:PORT of the cluster's head"),
        (["run", "--ray", "127.0.0.1:1", "--engine", "trl"], "TRL's probes run on this machine only"),
    ],
)
def test_bad_cluster_flags_are_one_line_and_exit_2(argv, said, capsys):
    assert said in one_line_exit_2(argv, capsys)


def test_ray_auto_with_a_dead_address_in_the_environment_is_one_line_at_once(monkeypatch, capsys):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    started = time.monotonic()
    err = one_line_exit_2(["run", "--ray", "auto", "--space", "cpu-tiny"], capsys)
    assert time.monotonic() - started < 30
    assert "--ray auto: $RAY_ADDRESS names 127.0.0.1:1, and nobody answers there" in err
    assert "--ray HOST:PORT" in err


def test_ray_auto_with_a_stale_record_of_ray_start_is_one_line(monkeypatch, tmp_path, capsys):
    """`ray start` leaves the head's address in ray/ray_current_cluster; a cluster since stopped leaves it
    behind, and Ray would wait minutes on it."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:1\n")
    err = one_line_exit_2(["probe", "--ray", "auto"], capsys)
    assert "names 127.0.0.1:1, and nobody answers there" in err and "ray_current_cluster" in err


def test_without_ray_the_flag_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    err = one_line_exit_2(["run", "--ray", "auto", "--space", "cpu-tiny"], capsys)
    assert 'pip install "autotune-rl[ray]"' in err and "Ray 2.60.0" in err


def test_several_nodes_cannot_export_for_trl():
    from autotune.trainers.registry import check_cluster_use, engine_named, trainer_named

    builtin = engine_named("builtin")
    with pytest.raises(UserError, match="the TRL export is for one machine"):
        check_cluster_use("auto", 2, builtin, trainer_named("trl"))
    with pytest.raises(UserError, match="--ray with --engine trl: TRL's probes run on this machine only"):
        check_cluster_use("auto", 1, engine_named("trl"), trainer_named("trl"))
    check_cluster_use("auto", 2, builtin, trainer_named("verl"))
    check_flags(None, 1)
    check_flags("auto", 2)


CLUSTER = Cluster(
    "10.0.0.1:6379",
    (
        Node("a" * 56, "10.0.0.1", "head", cpus=8, gpus=0),
        Node("b" * 56, "10.0.0.2", "10.0.0.2", cpus=32, gpus=8),
        Node("c" * 56, "10.0.0.3", "10.0.0.3", cpus=32, gpus=4),
    ),
)


def test_a_cluster_must_hold_nodes_times_gpus_for_every_probe_at_once():
    check_fits(CLUSTER, "cuda", nodes=2, per_node=4)
    check_fits(CLUSTER, "cuda", nodes=1, per_node=4, parallel=3)  # 8 GPUs hold two probes, 4 one
    with pytest.raises(UserError) as caught:
        check_fits(CLUSTER, "cuda", nodes=2, per_node=8)
    message = str(caught.value)
    assert message.startswith("--nodes 2 --gpus 8: each probe needs 2 node(s) with 8 GPU(s) (and a CPU per")
    assert "10.0.0.2 (bbbbbbbb) 8 GPU, 32 CPU, 10.0.0.3 (cccccccc) 4 GPU, 32 CPU" in message
    assert "\n" not in message
    few_cpus = Cluster("x:1", (Node("e" * 56, "x", "x", cpus=2, gpus=8),))
    with pytest.raises(UserError, match=re.escape("has 1 alive node(s): x (eeeeeeee) 8 GPU, 2 CPU")):
        check_fits(few_cpus, "cuda", nodes=1, per_node=4)  # each GPU rank's actor holds a CPU too
    with pytest.raises(UserError, match="4 probes at once need 4 such places"):
        check_fits(CLUSTER, "cuda", nodes=1, per_node=4, parallel=4)
    with pytest.raises(UserError, match=r"2 CPU\(s\), one per rank, free"):
        check_fits(Cluster("x:1", (Node("d" * 56, "x", "x", cpus=1),) * 2), "cpu", nodes=2, per_node=2)


def test_the_device_follows_the_cluster():
    assert cluster_device("auto", CLUSTER) == "cuda"
    cpus = Cluster("x:1", (Node("d" * 56, "x", "x", cpus=4),))
    assert cluster_device("auto", cpus) == "cpu"
    with pytest.raises(UserError, match="--device cuda: the cluster at x:1 has no GPU"):
        cluster_device("cuda", cpus)


# --- W = nodes × GPUs per node ------------------------------------------------------------------------------


def test_every_gpu_rule_takes_nodes_times_gpus_per_node():
    options = RunOptions(gpus=4, nodes=2)
    assert command_line_space({"gpus": 1, "rollout_n": 2}, options)["gpus"] == 8
    assert command_line_space({"gpus": 2}, RunOptions(nodes=3))["gpus"] == 6  # the space's, on each node
    assert command_line_space({"gpus": 2}, RunOptions())["gpus"] == 2
    settings = ProbeSettings(world_size=8, nodes=2)
    assert settings.gpus_per_node == 4
    assert bundles("cuda", 2, 4) == [{"CPU": 4.0, "GPU": 4.0}] * 2
    assert bundles("cpu", 2, 1) == [{"CPU": 1.0}] * 2


def test_the_verl_export_spreads_the_gpus_over_the_nodes():
    values = verl_overrides(CONFIG, 2, nodes=2).values
    assert values["trainer.nnodes"] == 2 and values["trainer.n_gpus_per_node"] == 1
    assert verl_overrides(CONFIG, 2).values["trainer.nnodes"] == 1
    with pytest.raises(ValueError, match="cannot be spread evenly over 3 node"):
        verl_overrides(CONFIG, 2, nodes=3)


def test_verl_on_a_cluster_joins_it_and_keeps_no_ray_of_its_own(tmp_path):
    run = verl_run(
        CONFIG,
        world_size=2,
        steps=3,
        model_path="m",
        run_dir=tmp_path,
        verl_python="python",
        card_bytes=0.0,
        resident_bytes=None,
        nodes=2,
        ray_address="10.0.0.1:6379",
    )
    argv = run.argv
    assert "trainer.nnodes=2" in argv and "trainer.n_gpus_per_node=1" in argv
    assert "+ray_kwargs.ray_init.address=10.0.0.1:6379" in argv
    assert not any("_temp_dir" in arg for arg in argv) and "CUDA_VISIBLE_DEVICES" not in run.env
    alone = verl_run(CONFIG, world_size=2, steps=3, model_path="m", run_dir=tmp_path, verl_python="p",
                     card_bytes=0.0, resident_bytes=None)  # fmt: skip
    assert "+ray_kwargs.ray_init.address=local" in alone.argv


def test_slots_on_a_cluster_are_placed_by_ray():
    slots = plan_slots(3, 8, "cuda", gpus=[], cluster=True)  # no GPU here: Ray places them
    assert [slot.describe() for slot in slots] == [f"slot {i}: placed by Ray" for i in range(3)]
    assert slots[0].apply(ProbeSettings(world_size=8)).visible_devices is None
    assert not oversubscribed(slots, 8, cores=2)


def test_a_worker_does_not_join_a_study_that_spans_nodes(tmp_path):
    from autotune.run.worker import WorkerOptions, run_worker
    from autotune.study.trials import open_study

    storage = f"journal:{tmp_path / 'study.journal'}"
    study = open_study(storage, "multi", None)
    StudyPlan(model="tiny-llama", gpus=2, space={"model": "tiny-llama"}, settings={"nodes": 2}).save(study)
    with pytest.raises(UserError, match="span 2 nodes of a Ray cluster, and a worker probes on its own"):
        run_worker(WorkerOptions(study="multi", storage=storage))


# --- a rank whose actor is gone ---------------------------------------------------------------------------


def test_why_a_rank_actor_is_gone():
    exceptions = pytest.importorskip("ray.exceptions")
    from ray.core.generated.common_pb2 import ActorDiedErrorContext

    from autotune.probe.cluster.faults import gone_because

    monitor = "1 worker(s) were killed due to the node running low on memory. Memory on the node was 23 GB"
    killed = exceptions.ActorDiedError(ActorDiedErrorContext(error_message=monitor, actor_id=b"\0" * 16))
    for exc in (killed, exceptions.OutOfMemoryError("Task was killed due to the node running low on memory")):
        gone = gone_because(exc, "n1 (abcdef12)", True)
        assert gone.oom and not gone.lost and "memory monitor killed its worker on node n1" in gone.why
    lost = gone_because(exceptions.ActorDiedError(), "n2 (12345678)", node_alive=False)
    assert lost.lost and lost.why.startswith("node n2 (12345678) was lost during the probe")
    assert gone_because(exceptions.NodeDiedError("gone"), "n3", node_alive=None).lost
    crash = gone_because(exceptions.ActorDiedError(), "n4", node_alive=True)
    assert not crash.lost and not crash.oom and "its Ray worker on node n4 died" in crash.why


def _result_of(gone: dict, left: dict):
    from autotune.probe.cluster import ray_probe

    ranks = ray_probe.Ranks(actors=[None, None], nodes=["a (aaaaaaaa)", "b (bbbbbbbb)"], node_ids=["a", "b"])
    ranks.gone, ranks.left = gone, left
    ray = types.SimpleNamespace(
        nodes=lambda: [{"NodeID": "a", "Alive": True}, {"NodeID": "b", "Alive": False}]
    )
    settings = ProbeSettings(world_size=2, nodes=2, ray_address="a:1")
    return ray_probe._result(ray, CONFIG, settings, ranks, False, 30.0, 1.0)


def test_a_lost_node_is_a_crash_naming_it_and_a_memory_monitor_kill_a_host_oom():
    exceptions = pytest.importorskip("ray.exceptions")
    crashed = {0: {"code": 1, "result": None, "stderr": "gloo: connection closed by peer"}}
    result = _result_of({1: exceptions.ActorDiedError()}, crashed)
    assert result.status == Status.CRASHED and result.lost_node == "b (bbbbbbbb)"
    assert result.message == "rank 1: node b (bbbbbbbb) was lost during the probe (ActorDiedError)"
    assert (
        result.rank_nodes == ["a (aaaaaaaa)", "b (bbbbbbbb)"]
        and "[rank 0 on a (aaaaaaaa)]" in result.stderr_tail
    )
    oom = _result_of(
        {1: exceptions.OutOfMemoryError("Task was killed due to the node running low on memory")}, crashed
    )
    assert (oom.status, oom.oom_kind, oom.lost_node) == (Status.OOM, "host", None)
    assert "rank 1: Ray's memory monitor killed its worker on node b (bbbbbbbb)" in oom.message


class LostNodeOnce(FakeProbe):
    """The first probe loses its node; the rest measure."""

    def __call__(self, config, settings, cancel=None):
        if not self.launched:
            self.launched.append(config)
            return ProbeResult(status=Status.CRASHED, message="rank 0: node n was lost", lost_node="n (1)")
        return super().__call__(config, settings, cancel)


def test_a_trial_whose_node_was_lost_is_tried_once_more(tmp_path: Path):
    tuner = make_tuner(tmp_path, LostNodeOnce())
    first = tuner.step()
    assert trial_status(first) == Status.CRASHED and first.state == optuna.trial.TrialState.FAIL
    assert first.user_attrs["result"]["lost_node"] == "n (1)"
    again = tuner.step()
    assert again.user_attrs["retry_of"] == first.number and trial_status(again) in (Status.OK, Status.OOM)
    assert again.user_attrs["config"] == first.user_attrs["config"]
    (tmp_path / "plain").mkdir()
    plain = make_tuner(tmp_path / "plain", lambda c, s, cancel=None: ProbeResult(status=Status.CRASHED))
    plain.step()
    assert not plain.study.get_trials(states=(optuna.trial.TrialState.WAITING,))  # a crash is not retried
