"""A probe on the Ray cluster: its ranks as Ray actors in a placement group of their own, one process group
of torch.distributed over the nodes (gloo on CPU, NCCL on GPU), classified as a local probe is.

    result = run_cluster_probe(config, settings, runner_path())   # settings.ray_address: a joined cluster

1. The placement group: one bundle per node of the probe (autotune.probe.cluster.placement), granted within
   the placement timeout or one line (NotPlaced, exit 3).
2. One actor per rank in its node's bundle (autotune.probe.cluster.host), each saying where it is; rank 0's
   node and a free port there are the rendezvous. Each rank sees the GPU Ray gave its actor, so its local
   rank is 0; on CPU it takes the one CPU its actor holds.
3. The ranks run the same program as on one machine; the driver waits on them as the local launcher does
   (the wall-clock deadline, a short grace once one fails, Ctrl-C), then each actor ends its rank's process
   group and hands back its exit code, result file and stderr.
4. A rank whose actor is gone is explained by autotune.probe.cluster.faults: its node lost (crashed, naming
   the node; the study tries the trial again once), Ray's memory monitor (an OOM of the host), or a crash.
5. Whatever happens, the actors are killed and the placement group is removed before the call returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any

from autotune.config.knobs import ProbeConfig
from autotune.probe.cluster.faults import Gone, gone_because
from autotune.probe.cluster.host import RankHost
from autotune.probe.cluster.placement import reserved
from autotune.probe.conditions import other_cores
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.probe.launching import look, rank_variables, summarize
from autotune.status import Status

__all__ = ["run_cluster_probe"]

WAIT_SECONDS = 1.0  # each actor answers the driver's wait at least this often
START_SECONDS = 120.0  # for the actors to start (a Ray worker each) and say where they are
ANSWER_SECONDS = 60.0  # for the actors to end their ranks, or for Ray to declare them dead
END_SECONDS = 5.0  # the same, when the probe is being abandoned (Ctrl-C)
STDERR_TAIL_CHARS = 4000
FAILED_CODE = 1  # the exit code a rank whose actor is gone counts as, for the wait's grace


@dataclasses.dataclass
class Ranks:
    """The probe's rank actors and what is known of each."""

    actors: list[Any]
    nodes: list[str] = dataclasses.field(default_factory=list)  # each rank's node label
    node_ids: list[str] = dataclasses.field(default_factory=list)
    gone: dict[int, BaseException] = dataclasses.field(default_factory=dict)  # rank -> what Ray raised
    left: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)  # rank -> what it left
    cores: int | None = None  # rank 0's node's


def run_cluster_probe(
    config: ProbeConfig, settings: ProbeSettings, program: Path, cancel: threading.Event | None = None
) -> ProbeResult:
    """Run one probe on the cluster the tuner joined (settings.ray_address) and classify it."""
    import ray

    started = time.monotonic()
    ranks_settings = dataclasses.replace(
        settings, visible_devices=None, threads_per_rank=1 if settings.device == "cpu" else None
    )
    job: dict[str, Any] = {"config": config.to_dict(), "settings": dataclasses.asdict(ranks_settings)}
    if settings.prompts_file:  # --data's prompts travel with the job: the nodes need not share a disk
        job["prompt_texts"] = json.loads(Path(settings.prompts_file).read_text())
    with reserved(settings, cancel) as group:
        if group is None:
            return _cancelled(config, settings, time.monotonic() - started)
        placed = time.monotonic() - started
        ranks = Ranks(_actors(ray, group, settings))
        try:
            places = _where(ray, ranks)
            timed_out = False
            if places is not None and _start(ray, ranks, places, ranks_settings, str(program), job):
                timed_out = _wait(ray, ranks, settings.timeout_seconds, cancel)
            _collect(ray, ranks)
        except BaseException:  # Ctrl-C in `autotune probe`: end the ranks' process groups before the actors
            with contextlib.suppress(BaseException):
                _collect(ray, ranks, seconds=END_SECONDS)
            raise
        finally:
            for actor in ranks.actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
        return _result(ray, config, settings, ranks, timed_out, time.monotonic() - started, placed)


def _actors(ray: Any, group: Any, settings: ProbeSettings) -> list[Any]:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    host = ray.remote(RankHost)
    gpu = 1 if settings.device == "cuda" else 0
    return [
        host.options(
            num_cpus=1,
            num_gpus=gpu,
            max_restarts=0,
            max_task_retries=0,
            name=f"{group.id.hex()[:12]}-rank{rank}",
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=rank // settings.gpus_per_node
            ),
        ).remote()
        for rank in range(settings.world_size)
    ]


def _where(ray: Any, ranks: Ranks) -> list[dict[str, Any]] | None:
    """Each actor's node; None when one could not start (recorded in `ranks.gone`)."""
    from ray.exceptions import GetTimeoutError, RayError

    from autotune.probe.cluster.connect import read_cluster

    cluster = read_cluster(ray)
    places: list[dict[str, Any]] = []
    for rank, actor in enumerate(ranks.actors):
        try:
            place = ray.get(actor.where.remote(), timeout=START_SECONDS)
        except (RayError, GetTimeoutError) as exc:
            ranks.gone[rank] = exc
            ranks.nodes.append("unknown")
            ranks.node_ids.append("")
            continue
        node = cluster.node(place["id"])
        ranks.nodes.append(node.label if node else f"{place['ip']} ({place['id'][:8]})")
        ranks.node_ids.append(place["id"])
        places.append(place)
    ranks.cores = places[0]["cores"] if places else None
    return None if ranks.gone else places


def _start(
    ray: Any, ranks: Ranks, places: list[dict[str, Any]], settings: ProbeSettings, program: str, job: dict
) -> bool:
    """Start every rank, rank 0's node and port the rendezvous; False when an actor is gone meanwhile."""
    from ray.exceptions import RayError

    lead = places[0]
    started = []
    for rank, actor in enumerate(ranks.actors):
        variables = rank_variables(rank, settings, lead["port"], lead["ip"], local_rank=0)
        started.append(actor.start.remote(program, job, variables, rank))
    for rank, ref in enumerate(started):
        try:
            ray.get(ref, timeout=START_SECONDS)
        except RayError as exc:
            ranks.gone[rank] = exc
    return not ranks.gone


def _wait(ray: Any, ranks: Ranks, timeout: float, cancel: threading.Event | None) -> bool:
    """Wait for every rank as the local launcher does (autotune.probe.launcher.look); True when the deadline
    passed. Each actor answers within WAIT_SECONDS, so a lost node never blocks the loop."""
    from ray.exceptions import RayError

    deadline = time.monotonic() + timeout
    codes: list[int | None] = [None] * len(ranks.actors)
    asked = {rank: actor.wait.remote(WAIT_SECONDS) for rank, actor in enumerate(ranks.actors)}
    while not (cancel is not None and cancel.is_set()):
        ready = set(ray.wait([*asked.values()], num_returns=1, timeout=WAIT_SECONDS)[0] if asked else [])
        for rank, ref in list(asked.items()):
            if ref not in ready:
                continue
            del asked[rank]
            try:
                codes[rank] = ray.get(ref)
            except RayError as exc:
                ranks.gone[rank], codes[rank] = exc, FAILED_CODE
                continue
            if codes[rank] is None:
                asked[rank] = ranks.actors[rank].wait.remote(WAIT_SECONDS)
        verdict, deadline = look(codes, deadline, time.monotonic())
        if verdict is not None:
            return verdict == "timeout"
    return False


def _collect(ray: Any, ranks: Ranks, seconds: float = 0.0) -> None:
    """Each live actor ends its rank and hands back what it left; one that does not answer within `seconds`
    (ANSWER_SECONDS: its node dying, Ray declares it dead in that time) is gone."""
    from ray.exceptions import GetTimeoutError, RayError

    seconds = seconds or ANSWER_SECONDS
    asked = {
        r: a.finish.remote()
        for r, a in enumerate(ranks.actors)
        if r not in ranks.gone.keys() | ranks.left.keys()
    }
    deadline = time.monotonic() + seconds
    for rank, ref in asked.items():
        try:
            ranks.left[rank] = ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
        except GetTimeoutError:
            ranks.gone[rank] = TimeoutError(f"its actor did not answer within {seconds:.0f} s")
        except RayError as exc:
            ranks.gone[rank] = exc


def _explain(ray: Any, ranks: Ranks) -> dict[int, Gone]:
    alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
    known = {rank: ranks.node_ids[rank] in alive if ranks.node_ids[rank] else None for rank in ranks.gone}
    return {rank: gone_because(exc, ranks.nodes[rank], known[rank]) for rank, exc in ranks.gone.items()}


def _result(
    ray: Any,
    config: ProbeConfig,
    settings: ProbeSettings,
    ranks: Ranks,
    timed_out: bool,
    wall: float,
    placed: float,
) -> ProbeResult:
    count = settings.world_size
    results: list[dict[str, Any] | None] = [ranks.left.get(r, {}).get("result") for r in range(count)]
    codes = [ranks.left.get(r, {}).get("code") for r in range(count)]
    gone = _explain(ray, ranks)
    for rank, why in gone.items():
        if why.oom:  # the host's OOM: a rank's OOM, as if it had caught it itself
            results[rank] = {"status": Status.OOM, "oom_kind": "host", "message": f"rank {rank}: {why.why}"}
    for rank, left in enumerate(results):
        if left and left.get("peak"):
            left["peak"]["node"] = ranks.nodes[rank]
    tails = [f"[rank {r} on {ranks.nodes[r]}] {left['stderr']}" for r, left in sorted(ranks.left.items())]
    result = summarize(
        config,
        settings,
        results,
        codes,
        timed_out,
        wall,
        "\n".join(tail for tail in tails if tail.strip())[-STDERR_TAIL_CHARS:],
        {rank: why.why for rank, why in gone.items() if not why.oom},
    )
    result.rank_nodes = list(ranks.nodes)
    lost = [ranks.nodes[rank] for rank, why in sorted(gone.items()) if why.lost]
    if result.status == Status.CRASHED and lost:
        result.lost_node = lost[0]
    lead = ranks.left.get(0, {})
    here = [r for r in range(count) if ranks.nodes[r] == ranks.nodes[0]]
    same_node = [(results[r] or {}).get("cpu") for r in here]
    result.environment = {
        **result.environment,
        "cluster": {"address": settings.ray_address, "placement_seconds": round(placed, 3)},
        "load": {  # rank 0's node: the ranks there shared it
            "other_cores": other_cores(same_node),
            "cores": ranks.cores,
            "load_1m_start": lead.get("load_1m_start"),
            "load_1m_end": lead.get("load_1m_end"),
        },
    }
    return result


def _cancelled(config: ProbeConfig, settings: ProbeSettings, wall: float) -> ProbeResult:
    """Ctrl-C (twice) while the cluster had not placed the probe yet: nothing ran."""
    return ProbeResult(
        status=Status.CRASHED,
        message="stopped while waiting for the Ray cluster to place the probe",
        wall_seconds=wall,
        world_size=settings.world_size,
        device=settings.device,
        config=config.to_dict(),
    )
