"""A stand-in for verl 0.9.1, for autotune's tests on machines without GPUs (where real verl refuses to run
PPO): `python -m verl.trainer.main_ppo KEY=VALUE ...` with this folder on PYTHONPATH writes what verl writes —
the file logger's JSON lines and the console's step lines — or fails the ways verl fails. Not verl: it trains
nothing; its timings and memory figures are made up from the configuration so that a study has a shape.

The rest of a V1 environment (transfer_queue, vLLM's distribution, orjson: autotune.probe.verl.install) is
stood in for by `runtime_pieces/` beside this package, put on the path when verl is imported (at its end, so
an installed piece wins), so that autotune's own environment, which has none of them, passes for verl's. A
test that wants an environment without one links this package and the other pieces into a folder of its own.
"""

import sys
from pathlib import Path

__version__ = "0.9.1"

_PIECES = str(Path(__file__).parent.parent / "runtime_pieces")
if _PIECES not in sys.path:
    sys.path.append(_PIECES)
