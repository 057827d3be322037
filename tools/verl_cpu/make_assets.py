"""The tiny job of the verl-on-CPU experiment (README.md): a 2-layer Llama with the project's tokenizer, and
GSM8K-shaped train/val parquet files in the layout autotune.probe.verl.dataset writes.

    .venv-verl/bin/python tools/verl_cpu/make_assets.py /tmp/verl-cpu
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TOKENIZER = Path(__file__).resolve().parents[2] / "autotune/models/tokenizer_files/autotune-bpe.json"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_model(out: Path) -> None:
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(TOKENIZER), pad_token="<pad>", bos_token="<s>", eos_token="<|im_end|>"
    )
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=4,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)


def write_data(out: Path) -> None:
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} plus {i + 1}? Answer after ####."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i + 1)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(16)
    ]
    pd.DataFrame.from_records(rows).to_parquet(out / "train.parquet", index=False)
    pd.DataFrame.from_records(rows[:4]).to_parquet(out / "val.parquet", index=False)


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/verl-cpu")
    (root / "model").mkdir(parents=True, exist_ok=True)
    write_model(root / "model")
    write_data(root)
    print(f"wrote {root}/model, {root}/train.parquet, {root}/val.parquet")
