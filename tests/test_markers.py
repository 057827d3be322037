"""The test tiers: `pytest -m "not e2e"` leaves out every test that needs a GPU, even where one is."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.conftest import REPO


class _Collected:
    """A plugin that keeps what a nested pytest run selected."""

    def __init__(self) -> None:
        self.items: list[pytest.Item] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.items = list(session.items)


def _collect(*args: str) -> list[pytest.Item]:
    collected = _Collected()
    code = pytest.main(
        ["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(REPO), *args], plugins=[collected]
    )
    assert code in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED), code
    return collected.items


def test_the_fast_tier_leaves_out_the_gpu_tests_where_cuda_is_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delitem(sys.modules, "tests.test_probe_cuda", raising=False)  # its skipif reads CUDA anew
    cuda_tests = str(REPO / "tests" / "test_probe_cuda.py")
    every = _collect(cuda_tests)
    assert every and all(item.get_closest_marker("cuda") and item.get_closest_marker("e2e") for item in every)
    # with a GPU visible they would run, not skip: only the marker keeps them out of the fast tier
    gpu_skips = [
        m for item in every for m in item.iter_markers("skipif") if "needs a CUDA GPU" in m.kwargs["reason"]
    ]
    assert gpu_skips and not any(mark.args[0] for mark in gpu_skips)
    assert _collect("-m", "not e2e", cuda_tests) == []
