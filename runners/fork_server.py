"""Fork server program: imports torch/transformers/peft once, then forks probe ranks on request.

Launched by path by `autotune.probe.forkserver` (never imported by the tuner), once per tuner process, with
`--parent TUNER_PID`; speaks JSON lines on stdin/stdout (the protocol is in `autotune.probe.forkserver`).
"""

import sys

from autotune.probe.forkserver import serve

if __name__ == "__main__":
    sys.exit(serve())
