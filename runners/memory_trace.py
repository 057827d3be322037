"""Memory trace program for `autotune check --trace`: a probe rank's training passes under FakeTensorMode.

Launched by path by `autotune.probe.traced` with one argument, the job as JSON ({"model", "reward",
"trust_remote_code", "config", "world_size", "layout", "pass_math", "lengths": the job's JobLengths, null at
the limits}); prints the trace as one JSON line, or {"failed": why} when the tracer cannot run the config
(autotune.probe.rank.trace).
"""

from __future__ import annotations

import sys

from autotune.probe.rank.trace import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
