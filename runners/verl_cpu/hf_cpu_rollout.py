"""A rollout for verl 0.9.1 that runs Hugging Face `generate` on CPU (issue 48), selected by
`actor_rollout_ref.rollout.name=hf_cpu`.

verl 0.9.1 registers only server rollouts (vLLM, SGLang, TRT-LLM). This module adds one through the two
registries verl looks rollouts up in, both keyed by `rollout.name`:

- `RolloutReplicaRegistry.register(name, loader)` (workers/rollout/replica.py:318), read by
  `LLMServerManager` (workers/rollout/llm_server.py:393) to launch the generation servers;
- `_ROLLOUT_REGISTRY[(name, "async")] = "module.Class"` (workers/rollout/base.py:89), read by the actor
  worker (workers/engine_workers.py:667) to build the adapter that hands it the trained weights. verl has
  no register function for this one; it is a module-level dict that `get_rollout_class` reads on each call.

The pieces:

- `HFCPUServer`, a Ray actor per replica: holds an HF copy of the model, answers the agent loop's
  `generate.remote(prompt_ids=, sampling_params=, request_id=)` with a `TokenOutput`
  (workers/rollout/replica.py:39), and `load_weights` replaces its weights;
- `HFCPUReplica`, the `RolloutReplica` that starts that actor (hybrid mode: next to the actor workers);
- `HFCPURollout`, the `BaseRollout` adapter in each actor worker: `update_weights` gathers the full tensors
  the FSDP engine yields (every rank must walk the generator: FSDP2's `full_tensor()` is a collective) and
  rank 0 of the replica ships them to the server actor as one Ray call. `resume`/`release` are no-ops:
  there is no device memory to free on CPU.

It is loaded by cpu_platform.py, so VERL_USE_EXTERNAL_MODULES=cpu_platform registers it in every process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Generator
from typing import Any

import ray
import torch
from verl.utils import normalize_token_ids
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

logger = logging.getLogger(__name__)

NAME = "hf_cpu"


def _server_name(replica_rank: int, suffix: str = "") -> str:
    return f"{NAME}_server_{replica_rank}_0{suffix}"


def _cfg(obj, key, default=None):
    """Read a field from a dataclass or a DictConfig alike."""
    if obj is None:
        return default
    if hasattr(obj, "get") and not hasattr(obj, "__dataclass_fields__"):
        return obj.get(key, default)
    return getattr(obj, key, default)


class HFCPUServer:
    """The generation server of one replica: HF `generate` on CPU, one request at a time."""

    def __init__(self, config, model_config, rollout_mode=None, replica_rank: int = 0):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        self.replica_rank = replica_rank
        self.rollout_mode = rollout_mode
        path = _cfg(model_config, "local_path") or _cfg(model_config, "path")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.model.eval()
        self.global_steps = None
        self.weight_version = 0  # how many load_weights calls this server has taken
        self._lock = threading.Lock()
        gen_cfg = self.model.generation_config
        eos = gen_cfg.eos_token_id if gen_cfg.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]

    # --- generation -------------------------------------------------------------------------------------

    def _max_tokens(self, n_prompt: int, sampling_params: dict) -> int:
        # The budget rule of vLLMHttpServer.generate (workers/rollout/vllm_rollout/vllm_async_server.py:593)
        max_model_len = _cfg(self.config, "max_model_len") or (
            _cfg(self.config, "prompt_length") + _cfg(self.config, "response_length")
        )
        room = max_model_len - n_prompt
        if "max_tokens" in sampling_params:
            want = sampling_params.pop("max_tokens")
        elif "max_new_tokens" in sampling_params:
            want = sampling_params.pop("max_new_tokens")
        else:
            rl, pl = _cfg(self.config, "response_length"), _cfg(self.config, "prompt_length")
            want = min(rl, pl + rl - n_prompt)
        return max(1, min(want, room))

    @torch.no_grad()
    def _generate(self, prompt_ids: list[int], sampling_params: dict) -> tuple[list[int], list[float]]:
        sp = dict(sampling_params)
        max_new = self._max_tokens(len(prompt_ids), sp)
        temperature = float(sp.get("temperature", 1.0) or 0.0)
        top_p = float(sp.get("top_p", 1.0))
        top_k = int(sp.get("top_k", -1))
        do_sample = temperature > 0
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new,
            do_sample=do_sample,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        if do_sample:
            gen_kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else 0)
        if sp.get("ignore_eos"):
            gen_kwargs["eos_token_id"] = None
        input_ids = torch.tensor([prompt_ids], dtype=torch.long)
        out = self.model.generate(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **gen_kwargs
        )
        token_ids = out.sequences[0, input_ids.shape[1] :].tolist()
        # HF pads a finished row only in a batch; a batch of one stops at EOS. Keep the EOS, as vLLM does.
        log_probs = []
        scale = temperature if do_sample else 1.0
        for step, tok in enumerate(token_ids):
            logits = out.logits[step][0].float() / scale
            log_probs.append(torch.log_softmax(logits, dim=-1)[tok].item())
        return token_ids, log_probs

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        **kwargs,
    ):
        assert image_data is None and video_data is None, "hf_cpu rollout: text only"
        prompt_ids = normalize_token_ids(prompt_ids)
        want_logprobs = bool(sampling_params.get("logprobs", False))

        def run():
            with self._lock:  # the model is shared; torch on 2 cores gains nothing from overlap
                return self._generate(prompt_ids, sampling_params)

        token_ids, log_probs = await asyncio.to_thread(run)
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs if want_logprobs else None,
            stop_reason="completed",
            num_preempted=0,
            extra_fields={"global_steps": self.global_steps},
        )

    # --- weights ----------------------------------------------------------------------------------------

    async def load_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> dict:
        def run():
            with self._lock:
                own = self.model.state_dict()
                unknown = sorted(set(state) - set(own))
                if unknown:
                    raise KeyError(f"hf_cpu rollout: weights the server's model lacks: {unknown[:5]}")
                missing = sorted(set(own) - set(state))
                # How far the new weights moved from the ones held: 0 on the first sync (the same checkpoint),
                # above 0 after an actor update, so the log shows that trained weights arrived.
                change = max((state[k].float() - own[k].float()).abs().max().item() for k in state)
                self.model.load_state_dict(state, strict=False)
                return missing, change

        missing, change = await asyncio.to_thread(run)
        self.weight_version += 1
        if global_steps is not None:
            self.global_steps = global_steps
        return {
            "loaded": len(state),
            "missing": missing,
            "weight_version": self.weight_version,
            "max_change": change,
        }

    async def set_global_steps(self, global_steps: int):
        self.global_steps = global_steps

    async def get_weight_version(self) -> int:
        return self.weight_version

    # --- the control calls RolloutReplica and the trainer make: nothing to free or pause on CPU ------------

    async def wake_up(self, tags: list[str] | None = None):
        return None

    async def sleep(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def wait_for_requests_to_drain(self):
        return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False):
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True):
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self):
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


class HFCPUReplica(RolloutReplica):
    """One HFCPUServer actor per replica; no HTTP server (the address is only a load-balancer key)."""

    async def launch_servers(self):
        name = _server_name(self.replica_rank, self.name_suffix)
        server = (
            ray.remote(HFCPUServer)
            .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
            .remote(
                config=self.config,
                model_config=self.model_config,
                rollout_mode=self.rollout_mode,
                replica_rank=self.replica_rank,
            )
        )
        self.servers = [server]
        self._server_handle = server
        self._server_address = name

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFCPURollout(BaseRollout):
    """The adapter in each actor worker: hands the trained weights to this replica's HFCPUServer."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **kwargs):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // size if replica_rank == -1 else replica_rank
        self._has_server = rank % size == 0
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(_server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        wire_format: str = "named_tensors",
        global_steps: int | None = None,
        **kwargs,
    ):
        assert wire_format == "named_tensors", f"hf_cpu rollout: wire_format {wire_format!r} not supported"
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("hf_cpu rollout: LoRA adapters are not supported")
        start = time.time()
        # Walk the generator on every rank: the FSDP engine's full_tensor() is a collective.
        state = {name: t.detach().to("cpu").contiguous().clone() for name, t in weights}
        if not self._has_server:
            return
        info = await self._server_handle().load_weights.remote(state, global_steps)
        if info["missing"]:
            logger.warning("hf_cpu rollout: the trainer sent no value for %s", info["missing"][:5])
        print(
            f"hf_cpu rollout: replica {self.replica_rank} took {info['loaded']} tensors "
            f"(weight version {info['weight_version']}, step {global_steps}, "
            f"max |change| {info['max_change']:.3g}) in {time.time() - start:.2f}s"
        )


def register() -> None:
    RolloutReplicaRegistry.register(NAME, lambda: HFCPUReplica)
    rollout_base._ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.HFCPURollout"


register()
