"""Joining the user's Ray cluster, and what it has, before any probe.

    with joined("10.0.0.5:6379") as cluster:      # or "auto": the cluster this machine belongs to
        device = cluster_device("auto", cluster)  # cuda when the cluster has GPUs
        check_fits(cluster, device, nodes=2, per_node=4, parallel=1)

Every mistake is one line (UserError, exit 2) before a probe starts: Ray not installed, an address nobody
answers at (Ray itself would wait minutes), a cluster with fewer nodes or GPUs than asked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import UserError

__all__ = [
    "INSTALL",
    "RAY_VERSION",
    "Cluster",
    "Node",
    "check_fits",
    "check_flags",
    "check_reachable",
    "cluster_device",
    "gpu_card",
    "joined",
    "on_cluster",
    "require_ray",
]

RAY_VERSION = "2.60.0"  # the Ray the `ray` extra pins, and the tests run
INSTALL = 'pip install "autotune-rl[ray]"'
CONNECT_SECONDS = 5.0  # to see that something answers at the address at all


def require_ray() -> Any:
    """The `ray` module; one line saying how to install it when it is missing."""
    try:
        import ray
    except ImportError:
        raise UserError(
            f"--ray needs Ray, which is not installed in this environment: {INSTALL} (Ray {RAY_VERSION})"
        ) from None
    return ray


@dataclass(frozen=True)
class Node:
    """One alive node of the cluster, as Ray's GCS lists it."""

    id: str
    ip: str
    name: str
    cpus: float = 0.0
    gpus: float = 0.0

    @property
    def label(self) -> str:
        """How messages and results name the node: its name (Ray's default is its IP) and its id's start,
        since several nodes may share a machine."""
        return f"{self.name} ({self.id[:8]})"

    def slots(self, device: str) -> float:
        """Ranks that fit here: each takes a CPU, and a GPU on CUDA (autotune.probe.cluster.placement)."""
        return min(self.gpus, self.cpus) if device == "cuda" else self.cpus


@dataclass(frozen=True)
class Cluster:
    address: str  # the GCS address this tuner joined (host:port): what verl is pointed at too
    nodes: tuple[Node, ...]

    def describe(self, device: str) -> str:
        def has(node: Node) -> str:
            return f"{node.gpus:g} GPU, {node.cpus:g} CPU" if device == "cuda" else f"{node.cpus:g} CPU"

        shown = ", ".join(f"{node.label} {has(node)}" for node in self.nodes) or "none"
        return f"{len(self.nodes)} alive node(s): {shown}"

    def node(self, node_id: str) -> Node | None:
        return next((n for n in self.nodes if n.id == node_id), None)


def check_reachable(address: str) -> None:
    """Something must answer at host:port: Ray's own connection attempt waits for minutes."""
    host, port = _host_port(address)
    if host is None:
        raise UserError(
            f"--ray {address!r}: expected HOST:PORT of the cluster's head (as `ray start --head` prints it) "
            f"or auto (the cluster this machine belongs to)"
        )
    why = _silent(host, port)
    if why:
        raise UserError(
            f"--ray {address}: nobody answers at {host}:{port} ({why}); start the cluster there "
            f"(`ray start --head`), give its head's address, or --ray auto on one of its nodes"
        )


def check_auto_reachable() -> None:
    """--ray auto: the head Ray would join must answer, as an explicit address must (on a stale record Ray
    waits minutes); with nothing recorded, Ray's own error comes at once."""
    address, where = recorded_address()
    host, port = _host_port(address or "")
    why = _silent(host, port) if host is not None else None
    if address is not None and why:
        raise UserError(
            f"--ray auto: {where} names {address}, and nobody answers there ({why}); start the cluster "
            f"(`ray start --head`), or give a live head's address: --ray HOST:PORT"
        )


def recorded_address() -> tuple[str | None, str]:
    """What `--ray auto` joins, as Ray finds it, and where that was read: $RAY_ADDRESS, else the head `ray
    start` recorded on this machine (ray/ray_current_cluster in RAY_TMPDIR or the temporary folder)."""
    named = os.environ.get("RAY_ADDRESS", "").strip()
    if named and named != "auto":
        return named, "$RAY_ADDRESS"
    record = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    with contextlib.suppress(OSError, IndexError):
        return record.read_text().split()[0], f"{record} (the cluster `ray start` recorded)"
    return None, ""


def _host_port(address: str) -> tuple[str | None, int]:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return (host, int(port)) if host and port.isdigit() else (None, 0)


def _silent(host: str, port: int) -> str | None:
    """Why nothing answers at host:port within CONNECT_SECONDS; None when something does."""
    try:
        socket.create_connection((host, port), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def read_cluster(ray: Any) -> Cluster:
    """The cluster the driver is connected to: its address and its alive nodes."""
    nodes = tuple(
        Node(
            id=entry["NodeID"],
            ip=entry.get("NodeManagerAddress", ""),
            name=entry.get("NodeName") or entry.get("NodeManagerAddress", ""),
            cpus=float(entry.get("Resources", {}).get("CPU", 0.0)),
            gpus=float(entry.get("Resources", {}).get("GPU", 0.0)),
        )
        for entry in ray.nodes()
        if entry.get("Alive")
    )
    return Cluster(ray.get_runtime_context().gcs_address, nodes)


@contextlib.contextmanager
def joined(address: str) -> Iterator[Cluster]:
    """This process as a driver of the cluster at `address` for the block; disconnected after it (unless it
    was connected before). `auto`: the cluster `ray start` recorded on this machine, or $RAY_ADDRESS."""
    ray = require_ray()
    if address == "auto":
        check_auto_reachable()
    else:
        check_reachable(address)
    own = not ray.is_initialized()
    if own:
        try:
            # namespace: autotune's actors apart from the user's; no logs of workers on the terminal (each
            # rank's stderr comes back with its result)
            quiet = {"logging_level": logging.WARNING, "log_to_driver": False}
            ray.init(address=address, namespace="autotune", **quiet)
        except ConnectionError as exc:
            raise UserError(f"--ray {address}: {str(exc).splitlines()[0]}") from None
    try:
        yield read_cluster(ray)
    finally:
        if own:
            ray.shutdown()


def cluster_device(requested: str, cluster: Cluster) -> str:
    """'cuda' or 'cpu' for probes on the cluster ('auto': CUDA when any node has a GPU)."""
    has_gpus = any(node.gpus >= 1 for node in cluster.nodes)
    device = ("cuda" if has_gpus else "cpu") if requested == "auto" else requested
    if device == "cuda" and not has_gpus:
        raise UserError(
            f"--device cuda: the cluster at {cluster.address} has no GPU ({cluster.describe('cuda')}); use "
            f"--device cpu, or start its nodes with their GPUs"
        )
    return device


def check_fits(cluster: Cluster, device: str, nodes: int, per_node: int, parallel: int = 1) -> None:
    """Refuse, in one line, a probe (or `parallel` probes at once) the cluster cannot place: each probe takes
    `per_node` GPUs (CPUs on CPU) on each of `nodes` different nodes."""
    unit = "GPU(s) (and a CPU per GPU)" if device == "cuda" else "CPU(s), one per rank,"
    able = [node for node in cluster.nodes if node.slots(device) >= per_node]
    places = sum(int(node.slots(device) // per_node) for node in cluster.nodes)
    if len(able) >= nodes and places >= nodes * parallel:
        return
    at_once = f"; {parallel} probes at once need {nodes * parallel} such places" if parallel > 1 else ""
    asked = f"--nodes {nodes} --gpus {per_node}" + (f" --parallel {parallel}" if parallel > 1 else "")
    raise UserError(
        f"{asked}: each probe needs {nodes} node(s) with {per_node} {unit} free{at_once}; the cluster at "
        f"{cluster.address} has {cluster.describe(device)}: lower --nodes, --gpus or --parallel, or add nodes"
    )


def check_flags(ray: str | None, nodes: int) -> None:
    """The command line's cluster flags, before anything else (no Ray needed to say these); what an engine or
    a trainer allows on a cluster is autotune.trainers.check_cluster_use's."""
    if nodes > 1 and ray is None:
        raise UserError(
            f"--nodes {nodes}: a probe over several machines runs on a Ray cluster: add --ray ADDRESS (its "
            f"head's HOST:PORT) or --ray auto, or leave --nodes out"
        )


def on_cluster(address: str | None) -> contextlib.AbstractContextManager[Cluster | None]:
    """`joined(address)`, or nothing to join without --ray."""
    return joined(address) if address is not None else contextlib.nullcontext()


CARD_SECONDS = 120.0


def gpu_card() -> tuple[str, int]:
    """The name and memory of a GPU the cluster gives a task (its first visible one), read with NVML on its
    node: the card a study on CUDA measures on, and its budget when none is given."""
    ray = require_ray()

    @ray.remote(num_gpus=1, num_cpus=0)
    def card() -> tuple[str, int]:
        import os

        import pynvml

        from autotune.probe.conditions import visible_gpus

        pynvml.nvmlInit()
        handle = visible_gpus(pynvml, os.environ.get("CUDA_VISIBLE_DEVICES"))[0][1]
        name = pynvml.nvmlDeviceGetName(handle)
        return (name.decode() if isinstance(name, bytes) else name), int(
            pynvml.nvmlDeviceGetMemoryInfo(handle).total
        )

    try:
        return ray.get(card.remote(), timeout=CARD_SECONDS)
    except Exception as exc:
        raise UserError(
            f"--ray: could not read a GPU's name and memory on the cluster within {CARD_SECONDS:g} s "
            f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); give "
            f"--memory-budget GIB"
        ) from None
