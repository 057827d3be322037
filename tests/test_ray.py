"""Probes on a Ray cluster of two nodes on this machine (Ray's own `ray.cluster_utils.Cluster`), CPU ranks
with gloo: a probe over both nodes, a study with --parallel 2 beside the same study on this machine, a node
removed mid-probe, verl (the stand-in) pointed at the cluster, and what must be refused or cleaned up.

One cluster for the module: a head that runs nothing (no CPU to offer, so removing a node never takes the
driver's) and two nodes of one CPU each, the smallest object store Ray allows, no dashboard. Its Ray temp dir
is the module's own ($RAY_TMPDIR), so no other Ray on this machine sees it and it sees none. The node removal
comes last: the tests before it have both nodes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import optuna
import psutil
import pytest
import yaml

from autotune.cli import main
from tests.conftest import QUICK_SPACE, REPO, wait_for

pytestmark = pytest.mark.e2e
RAY_SPACE = str(REPO / "tests" / "data" / "ray_space.yaml")
STAND_IN = REPO / "tests" / "fake_verl"
FAKES = REPO / "tests" / "fake_runners"
SMALL = {"object_store_memory": 75 * 1024**2}  # Ray's minimum
JOB = (  # ray_space.yaml's job at micro batch 2
    "--set train_batch_size=16 --set mini_batch_size=16 --set rollout_batch_size=16 --set micro_batch_size=2 "
    "--set max_prompt_length=16 --set max_response_length=32 --set gradient_checkpointing=false"
).split()


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray", reason='Ray is not installed: pip install -e ".[test]" (or "[ray]")')
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths are limited to 107 bytes
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", temp)
        # a lost node is noticed within about 3 s, not Ray's default 15 (the node removal test)
        checks = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
        head = {"num_cpus": 0, "include_dashboard": False, "_system_config": checks, **SMALL}
        made = Cluster(initialize_head=True, head_node_args=head)
        try:
            for _ in range(2):
                made.add_node(num_cpus=1, **SMALL)
            made.wait_for_nodes()
            yield made
        finally:
            made.shutdown()
            shutil.rmtree(temp, ignore_errors=True)


def worker_ids(cluster) -> set[str]:
    return {node.node_id for node in cluster.worker_nodes}


def short(node_id: str) -> str:
    return f"({node_id[:8]})"


def leftovers(address: str) -> dict[str, list]:
    """autotune's rank actors still alive and placement groups not removed, as the cluster's GCS has them."""
    import ray
    from ray._private import state
    from ray.util import placement_group_table

    own = not ray.is_initialized()
    if own:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    try:

        def now() -> dict[str, list]:
            actors = state.actors(actor_state_name="ALIVE").values()
            groups = [g for g in placement_group_table().values() if g["name"].startswith("autotune")]
            return {
                "actors": [a["Name"] for a in actors if a["ActorClassName"] == "RankHost"],
                "groups": [g["name"] for g in groups if g["state"] != "REMOVED"],
            }

        wait_for(lambda: not any(now().values()), timeout=15)
        return now()
    finally:
        if own:
            ray.shutdown()


def test_a_probe_over_two_nodes_runs_a_rank_on_each(cluster, capsys):
    argv = ["probe", "--ray", cluster.address, "--nodes", "2", "--gpus", "1", "--device", "cpu"]
    code = main([*argv, "--iterations", "1", "--json", *JOB])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["status"] == "ok", result
    assert result["world_size"] == 2 and len(set(result["rank_nodes"])) == 2
    # each rank names its node: the cluster's two worker nodes, one each
    named = {i for i in worker_ids(cluster) for label in result["rank_nodes"] if short(i) in label}
    assert named == worker_ids(cluster)
    assert [peak["node"] for peak in result["rank_peaks"]] == result["rank_nodes"]
    assert all(peak["bytes"] > 0 for peak in result["rank_peaks"])
    assert result["environment"]["cluster"]["address"] == cluster.address
    assert leftovers(cluster.address) == {"actors": [], "groups": []}


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--nodes", "3"],
            "--nodes 3 --gpus 1: each probe needs 3 node(s) with 1 CPU(s), one per rank, free",
        ),
        (["--gpus", "2"], "--nodes 1 --gpus 2: each probe needs 1 node(s) with 2 CPU(s)"),
        (["--device", "cuda"], "--device cuda: the cluster at"),
    ],
)
def test_a_cluster_without_what_is_asked_is_one_line_before_any_probe(cluster, capsys, argv, said):
    job = [f"--set={knob}=48" for knob in ("train_batch_size", "mini_batch_size", "rollout_batch_size")]
    code = main(["probe", "--ray", cluster.address, *argv, *job])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and said in err, err
    assert "3 alive node(s)" in err  # what the cluster has: the head and the two nodes


def test_a_probe_the_cluster_cannot_place_in_time_is_one_line_and_leaves_nothing(cluster, capsys):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    try:
        busy = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD", name="other-work")
        ray.get(busy.ready(), timeout=60)  # other work holds both nodes' CPUs
        argv = ["probe", "--ray", cluster.address, "--placement-timeout", "2", *JOB]
        code = main(argv)
        err = capsys.readouterr().err.strip()  # the line saying what is probed, then the error
        assert code == 3 and len(err.splitlines()) == 2 and err.splitlines()[1].startswith("error: "), err
        assert "asked the Ray cluster at" in err and "for 1 node(s) with 1 CPU(s) each" in err
        assert "not placed within 2 s: 0 of its 2 CPU(s) are free now, on 3 alive node(s)" in err
        assert leftovers(cluster.address) == {"actors": [], "groups": []}
        remove_placement_group(busy)
    finally:
        ray.shutdown()


def test_a_second_ctrl_c_kills_the_ranks_and_leaves_no_actor_or_placement_group(cluster):
    """The tuner's second Ctrl-C sets `cancel` (autotune.run.loop.StopControl); the trial is then recorded
    interrupted and re-queued, as on one machine."""
    import ray

    from autotune.config.knobs import ProbeConfig
    from autotune.probe.contract import ProbeSettings
    from autotune.probe.launcher import run_probe

    cancel = threading.Event()
    watcher = threading.Thread(target=lambda: wait_for(ranks, 120, 0.2) and cancel.set(), daemon=True)
    config = ProbeConfig(
        train_batch_size=16, rollout_batch_size=16, micro_batch_size=2, gradient_accumulation_steps=8
    )
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    try:
        settings = ProbeSettings(ray_address=cluster.address, iterations=50, timeout_seconds=300)
        watcher.start()
        result = run_probe(config, settings, cancel=cancel)
        assert cancel.is_set() and result.status == "crashed"
        assert leftovers(cluster.address) == {"actors": [], "groups": []}  # killed and removed by the probe
        assert wait_for(lambda: not ranks(), timeout=10)  # and its rank went with its actor
    finally:
        ray.shutdown()


def test_a_rank_host_hands_its_rank_the_job_and_the_data_prompts():
    """The actor's work, outside Ray: the job file, --data's prompts written beside it, the rank's
    rendezvous; what the rank left comes back, and its folder goes."""
    from autotune.probe.cluster.host import RankHost

    host = RankHost()
    job = {"config": {}, "settings": {"prompts_file": "/the/driver's/path"}, "prompt_texts": ["a b", "c"]}
    variables = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "10.0.0.9"}
    host.start(str(FAKES / "echo_job.py"), job, {**variables, "MASTER_PORT": "29511"}, rank=1)
    folder = host.folder
    assert host.wait(60) == 0
    left = host.finish()
    assert left["code"] == 0 and left["result"]["prompts"] == ["a b", "c"]
    assert left["result"]["job"]["settings"]["prompts_file"] == str(folder / "prompts.json")
    assert "prompt_texts" not in left["result"]["job"]
    assert left["result"]["env"] == {**variables, "MASTER_PORT": "29511"} and not folder.exists()


def verl_probe(cluster, tmp_path, monkeypatch, capsys) -> tuple[int, dict, list[str]]:
    argv_file = tmp_path / "argv.txt"
    monkeypatch.setenv("PYTHONPATH", str(STAND_IN))
    monkeypatch.setenv("AUTOTUNE_FAKE_VERL_ARGV", str(argv_file))
    argv = ["probe", "--engine", "verl", "--verl-python", sys.executable, "--ray", cluster.address]
    code = main([*argv, "--nodes", "2", "--gpus", "1", "--device", "cpu", "--json", *JOB])
    return code, json.loads(capsys.readouterr().out), argv_file.read_text().splitlines()


def test_verl_on_two_nodes_is_pointed_at_the_cluster(cluster, tmp_path, monkeypatch, capsys):
    code, result, argv = verl_probe(cluster, tmp_path, monkeypatch, capsys)
    assert code == 0 and result["status"] == "ok", result
    assert "trainer.nnodes=2" in argv and "trainer.n_gpus_per_node=1" in argv
    assert f"+ray_kwargs.ray_init.address={cluster.address}" in argv  # the cluster, not a Ray of its own
    assert not any(arg.startswith("+ray_kwargs.ray_init._temp_dir") for arg in argv)
    assert result["environment"]["cluster"]["address"] == cluster.address


def trials(out: Path) -> list[optuna.trial.FrozenTrial]:
    """Study "s" in `out`: its journal (--parallel 2) or its SQLite file."""
    from autotune.study.storage import make_storage

    journal = out / "s" / "study.journal"
    url = f"journal:{journal}" if journal.exists() else f"sqlite:///{out / 's' / 'study.db'}"
    return optuna.load_study(study_name="s", storage=make_storage(url)).get_trials()


def by_micro_batch(out: Path) -> dict[int, optuna.trial.FrozenTrial]:
    return {t.user_attrs["config"]["micro_batch_size"]: t for t in trials(out)}


def test_a_study_across_the_cluster_records_what_a_run_on_this_machine_records(cluster, tmp_path):
    """ray_space.yaml's two hand-made configs, two probes at once on the cluster and on this machine (one
    thread per rank in both), the two runs side by side."""
    common = [
        "--space",
        RAY_SPACE,
        "--trials",
        "2",
        "--parallel",
        "2",
        "--gain-rounds",
        "0",
        "--device",
        "cpu",
    ]
    runs = {
        "ray": [*common, "--ray", cluster.address, "--out", str(tmp_path / "ray"), "--study", "s"],
        "local": [*common, "--out", str(tmp_path / "local"), "--study", "s"],
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "autotune", "run", *argv],
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for name, argv in runs.items()
    }
    outputs = {name: proc.communicate(timeout=600)[0] for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, outputs[name][-3000:]
    ray_trials, local_trials = by_micro_batch(tmp_path / "ray"), by_micro_batch(tmp_path / "local")
    assert set(ray_trials) == set(local_trials) == {2, 16}
    for micro, trial in ray_trials.items():
        mine, theirs = trial.user_attrs["result"], local_trials[micro].user_attrs["result"]
        assert trial.user_attrs["status"] == local_trials[micro].user_attrs["status"]
        assert len(mine["rank_peaks"]) == len(theirs["rank_peaks"]) == 1
        peaks = mine["rank_peaks"][0]["bytes"], theirs["rank_peaks"][0]["bytes"]
        if trial.user_attrs["status"] == "ok":
            # the same process measured the same way: its peak RSS within the noise of two runs
            assert peaks[0] == pytest.approx(peaks[1], rel=0.05)
        else:
            # an emulated OOM stops where the 50 ms watch saw the budget passed: how far past depends on
            # how late a busy machine ran the watch, so both are past the budget, not equal
            budget_gib = yaml.safe_load(Path(RAY_SPACE).read_text())["memory_budget_gib"]
            assert min(peaks) > budget_gib * 2**30
        assert not theirs.get("rank_nodes")
    assert [ray_trials[m].user_attrs["status"] for m in (2, 16)] == ["ok", "oom"]
    nodes = {ray_trials[m].user_attrs["result"]["rank_nodes"][0] for m in (2, 16)}
    assert {short(i) for i in worker_ids(cluster)} == {label[-10:] for label in nodes}  # both nodes probed
    ray_dir, local_dir = tmp_path / "ray" / "s", tmp_path / "local" / "s"
    assert (ray_dir / "verl_overrides.txt").read_text() == (local_dir / "verl_overrides.txt").read_text()
    ray_best, local_best = (
        yaml.safe_load((d / "best_config.yaml").read_text()) for d in (ray_dir, local_dir)
    )
    for best in (ray_best, local_best):
        best.pop("measured")
    assert ray_best == local_best
    assert "2 probes at a time: slot 0: placed by Ray; slot 1: placed by Ray" in outputs["ray"]
    assert leftovers(cluster.address) == {"actors": [], "groups": []}


def ranks() -> list[psutil.Process]:
    """The probes' rank processes on the cluster's nodes (the rank actors start them in autotune-rank-*)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if "autotune-rank-" in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def _raylet_of(pid: int, cluster) -> object | None:
    """The cluster node whose raylet a process descends from (its Ray worker's parent)."""
    from ray._private import ray_constants

    raylet = ray_constants.PROCESS_TYPE_RAYLET
    raylets = {node.all_processes[raylet][0].process.pid: node for node in cluster.worker_nodes}
    with_parents = [psutil.Process(pid), *psutil.Process(pid).parents()]
    return next((raylets[p.pid] for p in with_parents if p.pid in raylets), None)


def test_a_node_lost_mid_probe_is_a_crash_naming_it_and_the_study_goes_on(cluster, tmp_path):
    """Last: it takes one of the two nodes away. One trial of quick_space.yaml: its hand-made config's probe
    loses its node, and is tried again on the node left."""
    argv = ["run", "--ray", cluster.address, "--space", QUICK_SPACE, "--trials", "1", "--gain-rounds", "0"]
    argv += ["--device", "cpu", "--out", str(tmp_path), "--study", "s"]
    tuner = subprocess.Popen([sys.executable, "-m", "autotune", *argv], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        assert wait_for(ranks, timeout=240, every=0.2), "no rank appeared"
        node = _raylet_of(ranks()[0].pid, cluster)
        assert node is not None, "the rank's node was not found"
        lost = node.node_id
        cluster.remove_node(node)
        output = tuner.communicate(timeout=600)[0]
    finally:
        tuner.kill()
    assert tuner.returncode == 0, output[-3000:]
    first, retry = trials(tmp_path)  # the hand-made config, then the same again
    result = first.user_attrs["result"]
    assert first.user_attrs["status"] == "crashed" and first.state.name == "FAIL"
    assert short(lost) in result["lost_node"] and "was lost during the probe" in result["message"]
    assert short(lost) in result["message"]
    assert retry.user_attrs["retry_of"] == first.number and retry.user_attrs["status"] == "ok"
    assert short(lost) not in retry.user_attrs["result"]["rank_nodes"][0]  # elsewhere: the node left
    assert (tmp_path / "s" / "best_config.yaml").is_file()  # the study went on to its report
    assert leftovers(cluster.address) == {"actors": [], "groups": []}
