"""A probe that hangs, with a child of its own, to test that the timeout kills the whole group."""

import os
import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["FAKE_PIDS_FILE"], "a") as pids:
    pids.write(f"{os.getpid()}\n{child.pid}\n")
time.sleep(600)
