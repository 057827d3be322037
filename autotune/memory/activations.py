"""The dynamic bytes of one micro batch: what a decoder layer saves for backward or holds in a forward, the
logits (whole, or in a fused head's tiles) and autocast's weight copies. The phases add them up."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.config.knobs import ProbeConfig
from autotune.memory.architecture import Architecture, Precision

__all__ = [
    "MicroBatch",
    "autocast_weight_copy",
    "forward_logits",
    "layer_forward_bytes",
    "training_activations",
    "training_logits",
]


def _layer_training_bytes(arch: Architecture, p: Precision, lora: bool = False) -> int:
    """Bytes one decoder layer saves for backward per token (HF llama/qwen2 with SDPA: no s² term).

    Two RMSNorms save their fp32 input, the normalised value and the weighted output (3·h·4 B each, plus the
    bf16 cast the next matmul saves under autocast; on a bf16 stream the input's fp32 copy and two bf16
    values, 8·h B); attention saves q and k after RoPE, v, the SDPA output
    and o_proj's input (3·q + 2·kv elements); the SwiGLU MLP saves gate, up, silu(gate) and the product (4·I).
    Korthikanti et al.'s 34·s·b·h written out for a llama block: fp32 (CPU) 24h + 12q + 8kv + 16I bytes per
    token; under autocast (fp32 residual and norms, bf16 matmuls) 28h + 6q + 4kv + 8I. With LoRA under
    autocast, peft casts each adapter's input to the adapters' fp32 and the cast is saved too: 12h + 2I more.
    """
    h = arch.hidden
    cast = 2 * h if p.act < 4 else 0
    # a bf16 stream: each norm saves its input's fp32 copy and two bf16 values (the trace at 7B-13B)
    norms = 2 * (h * 4 + 2 * h * 2) if p.residual < 4 else 2 * (3 * h * 4 + cast)
    attention = p.act * (3 * arch.q_size + 2 * arch.kv_size)
    mlp = p.act * 4 * arch.intermediate
    adapters = 12 * h + 2 * arch.intermediate if lora and p.autocast else 0
    return norms + attention + mlp + adapters


def layer_forward_bytes(arch: Architecture, p: Precision) -> int:
    """Peak bytes per token inside one layer of a forward-only pass (tensors are freed as they go)."""
    h, i = arch.hidden, arch.intermediate
    return p.residual * 3 * h + p.act * max(3 * i, 3 * arch.q_size + 4 * arch.kv_size)


@dataclass(frozen=True)
class MicroBatch:
    """A training pass's largest micro batch as the memory sees it: its tokens, the attention mask's bytes
    (shared by the layers), and whether it is packed (verl: the logits of every token) or padded rows (the
    logits of the response positions of `rows` samples)."""

    tokens: int
    mask: int
    packed: bool
    rows: int = 0
    fused: bool = False  # TRL 1.16's fused LM head: log-probs in tiles, no full logits (`_fused_head_bytes`)

    @classmethod
    def padded(cls, config: ProbeConfig, rows: int, fused: bool = False) -> MicroBatch:
        """rows × (Lp + Lr) tokens and the 4D bool SDPA mask of each row."""
        return cls(rows * config.sequence_length, rows * config.sequence_length**2, False, rows, fused)

    @classmethod
    def of_packed(cls, tokens: int, device: str) -> MicroBatch:
        """A packed row: on CPU Hugging Face builds the block-diagonal bool mask (tokens² bytes) from the
        position ids; on GPU verl attends with flash-attn's varlen kernels, which hold none."""
        return cls(tokens, tokens * tokens if device == "cpu" else 0, True)


def training_activations(
    arch: Architecture, config: ProbeConfig, p: Precision, run: MicroBatch
) -> tuple[int, int, int]:
    """(saved activations, backward workspace, backward's end) of one training micro-batch: the end is the
    first layer's backward, the only layer left (its input or saved tensors, its workspace, the mask)."""
    tokens = run.tokens
    layer = _layer_training_bytes(arch, p, config.use_lora) * tokens
    final_norm = 3 * arch.hidden * 4 * tokens
    mask = run.mask
    if config.gradient_checkpointing:
        # non-reentrant checkpointing keeps each layer's input; backward recomputes one layer at a time. The
        # workspace is what the layers' moment adds to `saved`: the recomputed layer, its MLP's gradients
        # (gate, up and their product at the compute dtype), less the final norm's tensors, freed before
        # backward reaches the layers (the trace at 7B-13B: 1.3-1.5 layers beside the inputs, as this says)
        layer_input = p.residual * arch.hidden * tokens
        saved = arch.layers * layer_input + final_norm + mask
        workspace = layer + 3 * arch.intermediate * p.act * tokens
        return saved, workspace - final_norm, layer_input + workspace + mask
    return arch.layers * layer + final_norm + mask, layer, 2 * layer + mask


def _logit_elements(rows: int, config: ProbeConfig, arch: Architecture) -> int:
    return rows * (config.max_response_length + 1) * arch.vocab  # logits_to_keep = Lr + 1


def _logit_row_bytes(config: ProbeConfig, arch: Architecture) -> int:
    """logprobs_from_logits works one sample at a time: one fp32 row of Lr × V."""
    return config.max_response_length * arch.vocab * 4


def training_logits(arch: Architecture, config: ProbeConfig, p: Precision, run: MicroBatch) -> int:
    """A training micro-batch's logits with their gradients.

    Padded rows (the response positions): three fp32 copies at once: the logits (saved by every row's
    logsumexp; under autocast their fp32 `.float()` copy — the bf16 logits die with `response_log_probs`),
    the gradient accumulating over the rows, and the next row's full-size `select_backward` gradient
    (measured on CPU: 2.98 copies), plus two row temporaries. (A CPU probe returns freed tensors to the
    system, as a device allocator frees them: see autotune.probe.contract.MMAP_THRESHOLD; glibc's heap would
    otherwise keep freed rows resident.)
    Packed (verl, every token's logits): on CPU the same three fp32 copies (verl's row-wise log-probs with
    logsumexp, one token per row); on GPU verl takes the log-probs with flash-attn's cross-entropy, which
    writes the gradient into the bf16 logits in place (`inplace_backward`): one copy.
    """
    if run.fused:
        return _fused_head_bytes(arch, config, p, run)
    if not run.packed:
        full = _logit_elements(run.rows, config, arch) * 4
        return 3 * full + 2 * _logit_row_bytes(config, arch)
    if p.autocast:
        return run.tokens * arch.vocab * p.act
    return 3 * run.tokens * arch.vocab * 4


def forward_logits(
    arch: Architecture, config: ProbeConfig, p: Precision, run: MicroBatch, entropy: bool
) -> int:
    """Forward-only logits. Padded rows: fp32 logits (+ the bf16 ones under autocast) and logsumexp's row
    temporaries (two). Packed (verl): the logits of every token, and with the entropy (verl's old log-prob
    pass) the softmax and one more vocabulary-sized temporary beside them (logsumexp's, then softmax ×
    logits); the log-probs come row by row (CPU) or from flash-attn's cross-entropy (GPU): no more."""
    if run.fused:
        return _fused_head_bytes(arch, config, p, run)
    if not run.packed:
        full = _logit_elements(run.rows, config, arch) * (4 + (2 if p.autocast else 0))
        return full + 2 * _logit_row_bytes(config, arch)
    return (3 if entropy else 1) * run.tokens * arch.vocab * p.act


# TRL 1.16's fused LM head (trl/kernels/chunked_logprob.py ChunkedLogProbFunction): the projection runs on
# tiles of at most 4096 tokens × 32768 vocabulary entries, folded into per-token sums. With Triton (CUDA) only
# the completion positions are scored and the kernels fold a tile in place; elsewhere every position is scored
# and torch's ops fold it, with temporaries of the tile's size: measured with TRL 1.16 on CPU (tiny-llama,
# micro batches of 2-8 rows of 48-144 tokens), 0.92-1.01 MiB per scored token at vocabulary 32000, i.e. about
# 8 fp32 tiles. On CUDA one tile in the compute dtype (not yet measured on a GPU).
FUSED_TOKEN_TILE, FUSED_VOCAB_TILE = 4096, 32768
FUSED_TILE_COPIES = {"cpu": 8, "cuda": 1}


def _fused_head_bytes(arch: Architecture, config: ProbeConfig, p: Precision, run: MicroBatch) -> int:
    """TRL 1.16's fused LM head over a micro batch: its tiles at their largest (see FUSED_TILE_COPIES)."""
    scored = run.rows * config.max_response_length if p.autocast else run.rows * (config.sequence_length - 1)
    tile = min(scored, FUSED_TOKEN_TILE) * min(arch.vocab, FUSED_VOCAB_TILE)
    copies = FUSED_TILE_COPIES["cuda" if p.autocast else "cpu"]
    return copies * tile * (p.act if p.autocast else 4)


def autocast_weight_copy(
    arch: Architecture, parameters: int, p: Precision, config: ProbeConfig, lm_head: bool = True
) -> int:
    """Autocast caches a bf16 copy of every fp32 leaf weight it casts: all but the input embedding (which a
    tied LM head casts after all). Kept until the autocast region ends, or backward frees it."""
    if not p.autocast or config.use_lora or config.sharded:
        # CPU runs fp32; a LoRA base is bf16 already (the adapters' copies are negligible); FSDP gathers
        # bf16 weights itself (its mixed precision), so autocast finds nothing to cast
        return 0
    embedding = 0 if lm_head and arch.tied_embeddings else arch.vocab * arch.hidden
    return 2 * max(parameters - embedding, 0)
