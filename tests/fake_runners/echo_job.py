"""A probe rank that measures nothing: it writes back the job it was given, the prompts its job names and its
torch.distributed environment, as its result (the rank-side contract: --job in, result.rank<R>.json out)."""

import argparse
import json
import os
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--job", type=Path)
parser.add_argument("--out", type=Path)
args = parser.parse_args()
job = json.loads(args.job.read_text())
prompts = job["settings"].get("prompts_file")
rank = os.environ["RANK"]
RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
result = {
    "status": "ok",
    "job": job,
    "prompts": json.loads(Path(prompts).read_text()) if prompts else None,
    "env": {key: os.environ.get(key) for key in RENDEZVOUS},
}
(args.out / f"result.rank{rank}.json").write_text(json.dumps(result))
