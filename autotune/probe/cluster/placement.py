"""A probe's place on the cluster: one Ray placement group per probe, removed when the probe ends.

    with reserved(settings, cancel) as group:      # group.bundle_specs: one bundle per node of the probe
        ...                                        # the ranks' actors go into its bundles

One bundle per node, holding that node's ranks (`--gpus` GPUs, or CPUs on CPU), under STRICT_SPREAD: each
bundle on its own node. A bundle per rank cannot say "G ranks on each of N nodes" in any of Ray's strategies
(STRICT_SPREAD forbids two on a node, PACK and SPREAD may place 3 + 1), and verl's `trainer.n_gpus_per_node`
would then describe another job than the one measured.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from autotune.errors import Unavailable
from autotune.probe.contract import ProbeSettings

__all__ = ["NotPlaced", "bundles", "reserved"]

WAIT_STEP_SECONDS = 0.5  # how often a wait for the placement looks at Ctrl-C


class NotPlaced(Unavailable):
    """The cluster did not grant a probe's placement in --placement-timeout (exit 3; the study resumes)."""


def bundles(device: str, nodes: int, per_node: int) -> list[dict[str, float]]:
    """One bundle per node of the probe: a CPU per rank, and a GPU per rank on CUDA."""
    bundle = {"CPU": float(per_node), **({"GPU": float(per_node)} if device == "cuda" else {})}
    return [dict(bundle) for _ in range(nodes)]


def _not_placed(ray: Any, settings: ProbeSettings) -> NotPlaced:
    unit = "GPU" if settings.device == "cuda" else "CPU"
    free, total = ray.available_resources().get(unit, 0.0), ray.cluster_resources().get(unit, 0.0)
    alive = sum(1 for node in ray.nodes() if node.get("Alive"))
    return NotPlaced(
        f"a probe asked the Ray cluster at {settings.ray_address} for {settings.nodes} node(s) with "
        f"{settings.gpus_per_node} {unit}(s) each and was not placed within "
        f"{settings.placement_timeout:g} s: "
        f"{free:g} of its {total:g} {unit}(s) are free now, on {alive} alive node(s) (other work holds them, "
        f"or a node left); free them or raise --placement-timeout, then run the same command again (nothing "
        f"measured is lost)"
    )


@contextlib.contextmanager
def reserved(settings: ProbeSettings, cancel: threading.Event | None = None) -> Iterator[Any | None]:
    """The probe's placement group, ready (None when `cancel` was set while waiting); removed on exit,
    whatever happens. NotPlaced when the cluster does not grant it within the settings' placement timeout."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group(
        bundles(settings.device, settings.nodes, settings.gpus_per_node),
        strategy="STRICT_SPREAD",
        name=f"autotune-probe-{uuid.uuid4().hex[:8]}",
    )
    try:
        ready, deadline = group.ready(), time.monotonic() + settings.placement_timeout
        while not ray.wait([ready], timeout=WAIT_STEP_SECONDS)[0]:
            if cancel is not None and cancel.is_set():
                yield None
                return
            if time.monotonic() >= deadline:
                raise _not_placed(ray, settings)
        yield group
    finally:
        with contextlib.suppress(Exception):  # the cluster gone too: Ray frees what a dead driver held
            remove_placement_group(group)
