"""What the memory model knows of the models it prices: their shapes and parameter counts, and how many
bytes each kind of tensor takes on a device (the probe's dtypes). Every term of the model starts here."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.config.knobs import ProbeConfig

__all__ = [
    "DEVICES",
    "Architecture",
    "Precision",
    "layer_parameters",
    "trainable_parameters",
    "unit_parameters",
]

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Architecture:
    """What the memory model needs to know of the actor (and critic) and of the reward model."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    actor_parameters: int  # the causal LM (tied embeddings counted once)
    critic_parameters: int  # the same body with a one-output token head instead of the LM head
    reward_parameters: int = 0  # 0: a rule-based reward function, no model
    tied_embeddings: bool = False
    reward_layers: int = 0
    reward_hidden: int = 0
    reward_intermediate: int = 0
    reward_heads: int = 0

    @classmethod
    def from_specs(cls, actor_spec, reward_spec=None) -> Architecture:
        """From `ModelSpec`s: llama/qwen2 field names for the actor; deberta (or similar) for the reward."""
        from autotune.models.catalog import count_parameters

        c = actor_spec.config
        heads = c.num_attention_heads
        kv_heads = getattr(c, "num_key_value_heads", None) or heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        intermediate = (
            getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * c.hidden_size
        )
        reward: dict[str, int] = {}
        if reward_spec is not None:
            r = reward_spec.config
            reward = {
                "reward_parameters": count_parameters(reward_spec, "reward"),
                "reward_layers": r.num_hidden_layers,
                "reward_hidden": r.hidden_size,
                "reward_intermediate": getattr(r, "intermediate_size", None) or 4 * r.hidden_size,
                "reward_heads": r.num_attention_heads,
            }
        return cls(
            layers=c.num_hidden_layers,
            hidden=c.hidden_size,
            intermediate=intermediate,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            vocab=c.vocab_size,
            actor_parameters=count_parameters(actor_spec, "causal_lm"),
            critic_parameters=count_parameters(actor_spec, "critic"),
            tied_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
            **reward,
        )

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    def lora_parameters(self, r: int) -> int:
        """r·(d_in + d_out) for q, k, v, o, gate, up, down in every layer (peft's targets in the probe)."""
        h, q, kv, i = self.hidden, self.q_size, self.kv_size, self.intermediate
        per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
        return r * per_layer * self.layers


@dataclass(frozen=True)
class Precision:
    """Bytes per element of each kind of tensor, as `probe_models.dtypes` and autocast make them."""

    trainable: int  # full-model weights that train (fp32 on both devices), and all gradients/moments
    frozen: int  # reference, reward, a LoRA base: bf16 on GPU, fp32 on CPU
    act: int  # matmul outputs: bf16 under GPU autocast, fp32 on CPU
    residual: int  # the residual stream: the embedding's dtype as the forward sees it (see `of`)
    autocast: bool

    @classmethod
    def of(cls, device: str, use_lora: bool, sharded: bool = False) -> Precision:
        """On CUDA the residual stream is fp32 only where the embedding's weight is: a replicated full model
        under autocast (autocast leaves the embedding alone). FSDP's mixed precision gathers every weight in
        bf16 and a LoRA base is bf16, so the stream is bf16 there (the trace at 7B: 32 layers' checkpointed
        inputs at 2 B per element, not 4)."""
        if device == "cuda":
            return cls(trainable=4, frozen=2, act=2, residual=2 if use_lora or sharded else 4, autocast=True)
        return cls(trainable=4, frozen=4, act=4, residual=4, autocast=False)


def layer_parameters(arch: Architecture) -> int:
    """One decoder layer's parameters: the model less its embedding (and untied LM head), per layer."""
    embeddings = arch.vocab * arch.hidden * (1 if arch.tied_embeddings else 2)
    return (arch.actor_parameters - embeddings) // arch.layers


def unit_parameters(arch: Architecture) -> int:
    """The largest unit FSDP gathers at once: a block, or the embedding (the LM head is its size), as verl
    wraps them."""
    return max(layer_parameters(arch), arch.vocab * arch.hidden)


def trainable_parameters(arch: Architecture, config: ProbeConfig) -> tuple[int, int]:
    """(actor, critic) trainable parameters. LoRA critic: adapters + the value head (peft modules_to_save)."""
    critic = config.algorithm == "ppo"
    if config.use_lora:
        lora = arch.lora_parameters(config.lora_r)
        return lora, (lora + arch.hidden + 1) if critic else 0
    return arch.actor_parameters, arch.critic_parameters if critic else 0
