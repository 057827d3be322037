"""One attribute of a library swapped for a block, then put back.

    with swapped(torch.nn.Module, "to", to):   # Module.to is `to` inside the block only
        ...

Only for a library that calls a function by its module's or class's name and takes no argument to call
another: each use says which line of the library needs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["swapped"]


@contextlib.contextmanager
def swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` (a module's function, a class's method: its own attribute, not an inherited one) is
    `value` for the block, then what it was, however the block ends."""
    original = vars(owner)[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)
