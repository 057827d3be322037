"""verl 0.9.1's own reading of a verl probe's prompts, run with verl's Python (`.venv-verl/bin/python`), never
imported by autotune:

    .venv-verl/bin/python tests/verl_dataset_check.py TRAIN_PARQUET MODEL_DIR MAX_PROMPT_LENGTH

Loads the parquet through verl's `RLHFDataset` with the model's tokenizer as verl loads it (`hf_tokenizer`),
renders each row's messages with verl's Continuous Token builder (the V1 agent loop's only tokenization path:
experimental/agent_loop/agent_loop.py:248-254, 318-362) and applies verl's left truncation,
`AgentLoopBase._cap_text_prompt_length` (agent_loop.py:437-446). That method is compiled from verl's own
source file rather than imported: agent_loop.py's module imports the rollout server's stack (cachetools,
uvicorn, fastapi), which verl's base install in .venv-verl does not have.

Prints one JSON object: the chat template's fixed header (tokens every message's rendering starts with), the
truncation warnings verl's code logged, and per prompt its tokens as rendered and after truncation, whether it
is distinct among the step's prompts (the dataset is one step's prompts), and the longest run of leading
tokens it shares with another prompt (what vLLM's prefix caching could share).
"""

from __future__ import annotations

import ast
import itertools
import json
import logging
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

AGENT_LOOP_LOGGER = "verl.experimental.agent_loop.agent_loop"


class Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


def verl_truncation():
    """verl's `AgentLoopBase._cap_text_prompt_length`, compiled from its installed source, with the
    module's logger."""
    import verl

    source = Path(verl.__file__).parent / "experimental" / "agent_loop" / "agent_loop.py"
    tree = ast.parse(source.read_text())
    base = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "AgentLoopBase")
    method = next(
        node
        for node in base.body
        if isinstance(node, ast.FunctionDef) and node.name == "_cap_text_prompt_length"
    )
    namespace = {"logger": logging.getLogger(AGENT_LOOP_LOGGER)}
    exec(compile(ast.Module(body=[method], type_ignores=[]), str(source), "exec"), namespace)
    return namespace["_cap_text_prompt_length"]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def shared_prefixes(prompts: list[list[int]]) -> list[int]:
    """For each prompt, the longest prefix it shares with any other (its sorted neighbours hold it)."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    shared = [0] * len(prompts)
    for a, b in itertools.pairwise(order):
        n = common_prefix(prompts[a], prompts[b])
        shared[a], shared[b] = max(shared[a], n), max(shared[b], n)
    return shared


def check(parquet: str, model_dir: str, max_prompt_length: int) -> dict:
    from omegaconf import OmegaConf
    from transformers import AutoConfig
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    tokenizer = hf_tokenizer(model_dir)
    config = OmegaConf.create(
        {
            "max_prompt_length": max_prompt_length,
            "filter_overlong_prompts": False,  # as the probe launches verl
            "cache_dir": tempfile.mkdtemp(prefix="verl-dataset-check-"),
        }
    )
    dataset = RLHFDataset(data_files=[parquet], tokenizer=tokenizer, config=config)
    builder = create_continuous_token_builder(
        tokenizer,
        hf_model_type=AutoConfig.from_pretrained(model_dir).model_type,
        chat_template_kwargs=config.get("apply_chat_template_kwargs", {}),
    )
    cap = verl_truncation()
    loop = SimpleNamespace(rollout_config=SimpleNamespace(prompt_length=max_prompt_length))
    warnings = Count()
    logging.getLogger(AGENT_LOOP_LOGGER).addHandler(warnings)
    rendered = [builder.build_initial_tokens(dataset[i]["raw_prompt"]) for i in range(len(dataset))]
    capped = [cap(loop, list(ids)) for ids in rendered]
    seen: dict[tuple[int, ...], int] = {}
    for ids in capped:
        seen[tuple(ids)] = seen.get(tuple(ids), 0) + 1
    x, y = ([{"role": "user", "content": c}] for c in ("x", "y"))
    header = common_prefix(builder.build_initial_tokens(x), builder.build_initial_tokens(y))
    prompts = [
        {
            "index": i,
            "tokens_rendered": len(full),
            "tokens": len(ids),
            "truncated": len(ids) < len(full),
            "distinct": seen[tuple(ids)] == 1,
            "shared_prefix": shared,
        }
        for i, (full, ids, shared) in enumerate(zip(rendered, capped, shared_prefixes(capped), strict=True))
    ]
    return {
        "max_prompt_length": max_prompt_length,
        "rows": len(prompts),
        "header": header,
        "warnings": len(warnings.records),
        "warning_sample": warnings.records[:1],
        "distinct_share": sum(p["distinct"] for p in prompts) / max(1, len(prompts)),
        "exact_share": sum(p["tokens"] == max_prompt_length for p in prompts) / max(1, len(prompts)),
        "prompts": prompts,
    }


def main() -> int:
    parquet, model_dir, length = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print(json.dumps(check(parquet, model_dir, length)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
