"""A model verl can load on CPU, for the tests that run verl itself there (tests/test_verl_cpu.py): a 2-layer
Llama with random weights and the project's own tokenizer, a ChatML chat template (verl's agent loop renders
every prompt with the model's template), saved as a Hugging Face folder. Made offline, in a second."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO

TOKENIZER = REPO / "autotune" / "models" / "tokenizer_files" / "autotune-bpe.json"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_llama(folder: Path) -> Path:
    """The model and its tokenizer in `folder`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(TOKENIZER), pad_token="<pad>", bos_token="<s>", eos_token="<|im_end|>"
    )
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder
