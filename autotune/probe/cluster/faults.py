"""What it means when a rank's Ray actor is gone: decided by the parent, from Ray's exception type and the
cluster's own record of its nodes, as a local probe's status is decided from exit codes.

- Ray's memory monitor killed it: the node ran low on host memory, an OOM of the host (`oom_kind` host);
- its node is no longer alive (the GCS says so, or Ray raised NodeDiedError): the node was lost, and the
  trial is tried again once on the nodes left;
- anything else: its Ray worker died, a crash.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.probe.verl.failures import HOST_OOM

__all__ = ["Gone", "gone_because"]


@dataclass(frozen=True)
class Gone:
    """Why a rank's host is gone: `why` completes "rank R: ...", `oom` and `lost` say which kind."""

    why: str
    oom: bool = False
    lost: bool = False


def gone_because(exc: BaseException, node: str, node_alive: bool | None) -> Gone:
    """`exc`: what Ray raised for a call to the rank's actor; `node`: its node's label; `node_alive`: the
    GCS's record of that node now (None: unknown)."""
    from ray import exceptions

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    # Ray's own class for its memory monitor's kill; an actor's death carries the monitor's words instead
    # (autotune.probe.verl.failures.HOST_OOM quotes them)
    if isinstance(exc, exceptions.OutOfMemoryError) or HOST_OOM.search(str(exc)):
        return Gone(
            f"Ray's memory monitor killed its worker on node {node}: the node ran low on host memory "
            f"(an OOM of the host, not of a GPU)",
            oom=True,
        )
    if isinstance(exc, exceptions.NodeDiedError) or node_alive is False:
        return Gone(f"node {node} was lost during the probe ({type(exc).__name__})", lost=True)
    return Gone(f"its Ray worker on node {node} died: {type(exc).__name__}: {first}")
