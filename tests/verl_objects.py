"""What verl 0.9.1 builds its workers from, for a job's Hydra overrides: a flat digest of the objects, made by
running verl's own code. Run it with verl's Python (`.venv-verl/bin/python`), never with autotune's.

Each case's overrides are composed with verl's Hydra configuration and `verl.trainer.main_ppo.main` runs in
this process, as `python -m verl.trainer.main_ppo` would: validate_config, TaskRunnerV1.run, the V1 "sync"
PPOTrainer's __init__ (replay buffer) and _setup (tokenizer, dataloaders, resource pool, worker groups, the
critic's TrainingWorkerConfig), ActorRolloutRefWorker.init_model (reference, actor, rollout config and device
mesh, weight-sync engine), TrainingWorker.__init__ and the FSDP engines' constructors, LLMServerManager.create
(replicas) and AgentLoopManagerTQ.create; then, in place of fit, one step's prompt fetch and submission and
each PPO pass (old log-prob, reference log-prob, values, critic update, actor update) up to its engine call.

Replaced, each where verl's code reaches Ray, a GPU, the weights or vLLM (the rest runs as installed):
  - Ray: actors are built here as rank 0 (TaskRunner, workers, agent-loop workers); RayWorkerGroup and
    create_colocated_worker_cls (trainer_base.py:306-317); the GPU check of the resource pool; ray.get/nodes.
  - the process group: torch's "fake" backend with the job's world size (engine_workers.py:89), so the device
    meshes have their real shapes.
  - TransferQueue, always, and fastapi / uvicorn / cachetools when missing (verl's `verl-core` extra, which
    .venv-verl lacks): import-time stubs, none of them holds a setting.
  - the model: each engine's initialize (weights, optimizer), train/eval mode and forward, where a pass stops
    with what it handed the engine; the dataset (create_rl_dataset: files recorded, never read); tokenizers
    are loaded once per path.
  - vLLM and the servers: the rollout adapter class (the class verl's registry names is recorded), the
    replicas' launch_servers, the router, CheckpointEngineManager, RewardLoopManager. validate_config's last
    step with LoRA (vLLM's rank table) cannot run here: "not_run" says so.

One JSON line per case: {"name", "ok", "error" (verl's refusal and the line that raised), "not_run",
"selected": {key: its composed value, for the case's "select" keys}, "objects": {"<object>.<field>": plain
value}}, the prefixes being trainer, replay, algorithm, data
(dataloaders, one step's fetches), actor / ref / critic (.engine: engine config, .model: model config,
.config: the ActorConfig / CriticConfig of the loss, .engine_obj: the engine object, .*_pass: what each
pass hands its engine), rollout (RolloutConfig, device mesh, replicas, weight sync) and agent_loop.

    .venv-verl/bin/python tests/verl_objects.py OVERRIDES_FILE [KEY=VALUE ...]     # one file, by hand
    .venv-verl/bin/python tests/verl_objects.py --cases < cases.json   # [{"name", "overrides", "select"}]

The model path must be a local Hugging Face folder (config.json and a tokenizer, no weights:
tools/model_dir.py writes one). Run it with cwd="/", as tests/test_verl_validate.py runs verl_validate.py
(verl's wheel ships a top-level `tests` package).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib.abc
import importlib.machinery
import importlib.util
import json
import math
import os
import sys
import traceback
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from unittest import mock

# ----------------------------------------------------------------------------------------------------------
# Modules verl imports that .venv-verl lacks. TransferQueue (the Ray-backed sample store: trainer_base.py:30,
# main_ppo.py:137) is always replaced, like Ray; fastapi / uvicorn (the HTTP servers: rollout/utils.py:20,
# reward_loop/router/naive_router.py) and cachetools (rollout/router.py:21) only when missing: they are verl's
# `verl-core` extra, which `pip install verl==0.9.1` does not pull. None of them holds a setting.
# ----------------------------------------------------------------------------------------------------------
STUB_IF_MISSING = ("fastapi", "uvicorn", "cachetools")


class _Anything:
    """Any class or value a missing server package exposes at import time (decorators pass through)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Anything()

    def __getattr__(self, name: str) -> Any:
        return _Anything()


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (_Anything,), {})
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@dataclasses.dataclass
class KVBatchMeta:
    """transfer_queue.KVBatchMeta's fields, as verl reads them (transferqueue_utils.py:333-339)."""

    keys: list = dataclasses.field(default_factory=list)
    tags: list = dataclasses.field(default_factory=list)
    partition_id: str = "train"
    fields: Any = None
    extra_info: dict = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.keys)


def _fake_transfer_queue() -> types.ModuleType:
    """TransferQueue: every call is a no-op (verl only stores samples in it); KVBatchMeta a plain record."""
    module = types.ModuleType("transfer_queue")
    module.KVBatchMeta = KVBatchMeta
    module.BatchMeta = type("BatchMeta", (KVBatchMeta,), {})
    module.__getattr__ = _no_op_function
    return module


def _no_op_function(name: str) -> Callable:
    if name.startswith("__"):
        raise AttributeError(name)
    return lambda *args, **kwargs: None


def install_stubs() -> list[str]:
    sys.modules["transfer_queue"] = _fake_transfer_queue()
    missing = {name for name in STUB_IF_MISSING if importlib.util.find_spec(name) is None}
    sys.meta_path.insert(0, _StubFinder(missing))
    return ["transfer_queue", *sorted(missing)]


# ----------------------------------------------------------------------------------------------------------
# The flat digest.
# ----------------------------------------------------------------------------------------------------------
PLAIN = (bool, int, float, str, type(None))
NOT_PLAIN = object()
NEVER = {"hf_config", "generation_config", "tokenizer", "processor", "profiler"}  # objects, or not settings
OWN_DIGEST = {  # nested configs that have their own prefix (or are not batch settings)
    "engine", "fsdp", "fsdp_config", "megatron", "veomni", "torchtitan", "model", "model_config", "optim",
    "checkpoint", "profiler", "global_batch_info",
}  # fmt: skip


def _plain(value: Any) -> Any:
    from omegaconf import ListConfig

    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, PLAIN):
        return value
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return str(value)
    if isinstance(value, list | tuple | ListConfig) and all(isinstance(v, PLAIN) for v in value):
        return list(value)
    return NOT_PLAIN


def _items(obj: Any) -> list[tuple[str, Any]]:
    from omegaconf import DictConfig

    if dataclasses.is_dataclass(obj):
        return [(f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
    if isinstance(obj, Mapping | DictConfig):
        return [(str(k), obj[k]) for k in obj]
    return []


def flatten(prefix: str, obj: Any, out: dict[str, Any], skip: set[str] | frozenset = frozenset()) -> None:
    """Every plain field of a dataclass / mapping, nested ones dotted (those in `skip` left out)."""
    for name, value in _items(obj):
        if name.startswith("_") or name in skip or name in NEVER:
            continue
        plain = _plain(value)
        if plain is not NOT_PLAIN:
            out[f"{prefix}.{name}"] = plain
        elif prefix.count(".") < 5:
            flatten(f"{prefix}.{name}", value, out)


# ----------------------------------------------------------------------------------------------------------
# In-process stand-ins for Ray: a case's workers all live in this process, as rank 0 of a fake process group
# of the job's world size (torch's "fake" backend: collectives are no-ops, meshes have the real shapes).
# ----------------------------------------------------------------------------------------------------------
class PassReached(Exception):
    """Raised where a PPO pass hands its batch to the engine (the model is never built)."""

    def __init__(self, engine: Any, data: Any, adapter_disabled: bool) -> None:
        super().__init__("pass reached the engine")
        self.engine, self.data, self.adapter_disabled = engine, data, adapter_disabled


class Case:
    """What one case's run recorded, filled by the stand-ins below."""

    def __init__(self) -> None:
        self.runner: Any = None
        self.workers: dict[str, Any] = {}
        self.dataclass_calls: list[tuple[Any, Any]] = []
        self.rollouts: list[dict[str, Any]] = []
        self.replicas: list[Any] = []
        self.checkpoint_managers: list[dict[str, Any]] = []
        self.agent_chunks: list[int] = []
        self.fetches = 0
        self.loaders: dict[str, Any] = {}
        self.recorded: dict[str, Any] = {}  # plain entries, as they come
        self.submitted: list[int] = []
        self.calls: list[tuple[str, dict[str, Any], int]] = []
        self.passes: dict[str, dict[str, Any]] = {}
        self.not_run: str | None = None


def _actor_class(ray_cls: Any) -> type:
    """The user class behind `ray.remote(cls)`."""
    return ray_cls.__ray_metadata__.modified_class


class _Remote:
    def __init__(self, fn: Callable) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


class _Handle:
    """A Ray actor handle that runs `handle.method.remote(...)` now, in this process."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> _Remote:
        return _Remote(getattr(self._obj, name))


class InProcessActorClass:
    """`SomeActor.remote()` / `.options(...).remote()` building the actor here (main_ppo.py:92)."""

    def __init__(self, ray_cls: Any, case: Case) -> None:
        self.cls, self.case = _actor_class(ray_cls), case

    def options(self, **kwargs: Any) -> InProcessActorClass:
        return self

    def remote(self, *args: Any, **kwargs: Any) -> _Handle:
        self.case.runner = self.cls(*args, **kwargs)
        return _Handle(self.case.runner)


def _rows_of(meta: KVBatchMeta) -> Any:
    """The TensorDict one dp rank's worker gets for `meta`: an equal share of the rows, the trainer's
    extra_info as non-tensor data (transferqueue_utils.py:163-175; make_nd_compute_dataproto_dispatch_fn)."""
    import torch
    import torch.distributed as dist
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    rows = max(1, len(meta) // dist.get_world_size())
    data = TensorDict({"probe_rows": torch.zeros(rows, 1)}, batch_size=[rows])
    for key, value in meta.extra_info.items():
        tu.assign_non_tensor_data(tensor_dict=data, key=key, val=value)
    return data


class InProcessWorkerGroup:
    """RayWorkerGroup over one colocated pool: spawn() builds each role's worker class here, as rank 0, with
    the environment RayWorkerGroup gives its actors (worker.py:181-215); method calls run on that worker."""

    def __init__(self, resource_pool: Any, ray_cls_with_init: dict[str, Any], case: Case, **kw: Any) -> None:
        self.pool, self.class_dict, self.case = resource_pool, ray_cls_with_init, case

    def spawn(self, prefix_set: Any) -> dict[str, RoleGroup]:
        os.environ.update(
            WORLD_SIZE=str(self.pool.world_size),
            RANK="0",
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE=str(self.pool.store[0]),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT="29500",
        )
        groups = {}
        for prefix in prefix_set:
            ray_cls = self.class_dict[prefix]
            worker = _actor_class(ray_cls.cls)(*ray_cls.args, **ray_cls.kwargs)
            self.case.workers[prefix] = worker
            groups[prefix] = RoleGroup(worker, self.pool.world_size, self.case)
        return groups


class RoleGroup:
    """One role's worker group: `wg.method(batch)` runs the worker's method on rank 0's share."""

    def __init__(self, worker: Any, world_size: int, case: Case) -> None:
        self.worker, self.world_size, self.case = worker, world_size, case
        self.workers = [f"rank{rank}" for rank in range(world_size)]  # LLMServerManager slices these

    def __getattr__(self, name: str) -> Callable:
        method = getattr(self.worker, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            metas = [arg for arg in args if isinstance(arg, KVBatchMeta)]
            if metas:
                self.case.calls.append((name, dict(metas[0].extra_info), len(metas[0])))
            args = tuple(_rows_of(arg) if isinstance(arg, KVBatchMeta) else arg for arg in args)
            return method(*args, **kwargs)

        return call


def fake_process_group(timeout_second: Any = None, backend: Any = None) -> None:
    """engine_workers.py:89 initialize_global_process_group_ray, on torch's fake backend (no GPU, no peer)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)


def engine_without_model(case: Case, new: Callable) -> Callable:
    """EngineRegistry.new (engine/base.py:445): the real engine object, whose model-touching methods (build,
    train/eval mode, forward) are replaced; a pass's forward stops there with what the engine was given."""

    def build(*args: Any, **kwargs: Any) -> Any:
        engine = new(*args, **kwargs)
        state = {"adapter_disabled": False}

        @contextlib.contextmanager
        def disable_adapter() -> Iterator[None]:
            state["adapter_disabled"] = True
            try:
                yield
            finally:
                state["adapter_disabled"] = False

        def forward(data: Any, loss_function: Any = None) -> Any:
            raise PassReached(engine, data, state["adapter_disabled"])

        engine.initialize = lambda: None  # transformer_impl.py:207: loads the model, builds the optimizer
        engine.train_mode = engine.eval_mode = lambda **kw: contextlib.nullcontext()  # moves weights to GPU
        engine.disable_adapter = disable_adapter
        engine.train_batch = engine.infer_batch = forward
        return engine

    return build


def recording_to_dataclass(case: Case, to_dataclass: Callable) -> Callable:
    def convert(node: Any, *args: Any, **kwargs: Any) -> Any:
        result = to_dataclass(node, *args, **kwargs)
        case.dataclass_calls.append((node, result))
        return result

    return convert


def recording_rollout(case: Case) -> Callable:
    """get_rollout_class (rollout/base.py:96): the class verl's registry names, recorded, not imported
    (vLLM's ServerAdapter needs vLLM); what init_model builds it with (engine_workers.py:667-670)."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    class RecordingRollout:
        def __init__(self, config: Any, model_config: Any, device_mesh: Any, **kwargs: Any) -> None:
            case.rollouts.append({"config": config, "model_config": model_config, "device_mesh": device_mesh})

    def get_rollout_class(rollout_name: str, mode: str = "async") -> type:
        case.recorded["rollout.adapter_class"] = _ROLLOUT_REGISTRY[(rollout_name, mode)]
        return RecordingRollout

    return get_rollout_class


def recording_replica(case: Case) -> Callable:
    """get_rollout_replica_class (replica.py:393): a rollout replica (replica.py:70) whose servers are not
    launched (vLLM's HTTP servers are Ray actors); the backend verl asked for is recorded."""
    from verl.workers.rollout.replica import RolloutReplica

    class RecordingReplica(RolloutReplica):
        async def launch_servers(self) -> None:
            case.replicas.append(self)
            self._server_handle = f"server-{self.replica_rank}"
            self._server_address = f"replica-{self.replica_rank}:0"

    def get_rollout_replica_class(rollout: str, disaggregation_enabled: bool = False) -> type:
        case.recorded["rollout.replica.backend"] = rollout
        case.recorded["rollout.replica.disaggregation"] = disaggregation_enabled
        return RecordingReplica

    return get_rollout_replica_class


def recording_checkpoint_manager(case: Case) -> type:
    """CheckpointEngineManager (trainer_base.py:383): syncs weights to the replicas through Ray."""

    class RecordingCheckpointManager:
        def __init__(self, config: Any, actor_wg: Any, replicas: list) -> None:
            case.checkpoint_managers.append({"backend": config.backend, "replicas": len(replicas)})

        def __getattr__(self, name: str) -> Callable:
            return lambda *args, **kwargs: None

    return RecordingCheckpointManager


class NoRewardWorkers:
    """RewardLoopManager (trainer_base.py:347): Ray reward workers; a non-None handle list keeps the step on
    the streaming reward path (trainer_base.py:548)."""

    def __init__(self, config: Any, rm_resource_pool: Any = None) -> None:
        self.reward_loop_worker_handles: list = []


def recording_agent_worker_class(case: Case) -> Any:
    """AgentLoopWorkerTQ (agent_loop_tq.py:52), the Ray actor class the manager creates num_workers of."""

    class Worker:
        def generate_sequences(self, chunk: Any) -> None:
            case.agent_chunks.append(len(chunk))

    class WorkerClass:
        def options(self, **kwargs: Any) -> WorkerClass:
            return self

        def remote(self, *args: Any, **kwargs: Any) -> _Handle:
            return _Handle(Worker())

    return WorkerClass()


class ProbeDataset:
    """create_rl_dataset's dataset (rl_dataset.py:386-410 item keys); the data files are never read."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        return {
            "raw_prompt": [{"role": "user", "content": f"prompt {index}"}],
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
            "index": index,
        }


def probe_datasets(case: Case) -> Callable:
    """create_rl_dataset (trainer_base.py:710-725): the files verl would read are recorded."""

    def create(files: Any, data_config: Any, *args: Any, is_train: bool = True, **kw: Any) -> ProbeDataset:
        case.recorded[f"data.dataset.{'train' if is_train else 'val'}_files"] = _plain(files)
        if not is_train:
            return ProbeDataset(VAL_SIZE)
        fetch = max(int(data_config.train_batch_size), int(data_config.get("gen_batch_size") or 1))
        return ProbeDataset(4 * fetch)

    return create


VAL_SIZE = 8
LOADED: dict[tuple, Any] = {}


def loaded_once(load: Callable) -> Callable:
    """verl's hf_tokenizer / hf_processor (workers/config/model.py:161-162), each path read once per run:
    every HFModelConfig verl builds loads them again, and this script never looks at them."""

    def load_once(*args: Any, **kwargs: Any) -> Any:
        key = (load.__name__, args, tuple(sorted(kwargs.items())))
        if key not in LOADED:
            LOADED[key] = load(*args, **kwargs)
        return LOADED[key]

    return load_once


# ----------------------------------------------------------------------------------------------------------
# One step of the V1 trainer, in place of PPOTrainer.fit (trainer_base.py:412): the step's prompt fetch and
# submission (prepare_step), then each PPO pass the step runs, each up to its engine call.
# ----------------------------------------------------------------------------------------------------------
PASSES = (  # digest prefix, PPOTrainer method (trainer_base.py:1634-1866), whether this job runs it
    ("actor.log_prob_pass", "_compute_old_log_prob", lambda t: True),
    ("ref.log_prob_pass", "_compute_ref_log_prob", lambda t: t.use_reference_policy),
    ("critic.values_pass", "_compute_values", lambda t: t.use_critic),
    ("critic.update_pass", "_update_critic", lambda t: t.use_critic),
    ("actor.update_pass", "_update_actor", lambda t: True),
)


def probe_fit(case: Case) -> Callable:
    def fit(trainer: Any, agent_loop_manager: Any) -> None:
        from verl.utils.skip import SkipManager

        trainer.agent_loop_manager = agent_loop_manager
        SkipManager.init(trainer.config)  # as fit does (trainer_base.py:421)
        trainer.global_steps += 1
        loaders_part(case, trainer)
        trainer.train_dataloader.num_workers = 0  # after the digest: fetch in this process, not in forks
        trainer.prepare_step()  # trainer_base.py:1535: one step's prompts, dataloader -> agent loop
        samples = step_samples(trainer)
        for prefix, method, runs in PASSES:
            if runs(trainer):
                case.passes[prefix] = run_pass(case, trainer, method, samples)

    return fit


def step_samples(trainer: Any) -> int:
    """A step's samples: train_batch_size prompts x rollout.n, padded to the batch multiple the trainer
    needs (trainer_base.py:1589-1621, _balance_batch)."""
    import torch.distributed as dist

    n = trainer.config.actor_rollout_ref.rollout.n
    samples = trainer.config.data.train_batch_size * n
    multiple = trainer._get_required_batch_multiple(dist.get_world_size())
    return math.ceil(samples / multiple) * multiple


def run_pass(case: Case, trainer: Any, method: str, samples: int) -> dict[str, Any]:
    meta = KVBatchMeta(keys=[f"sample-{i}" for i in range(samples)], tags=[{} for _ in range(samples)])
    case.calls.clear()
    out: dict[str, Any] = {}
    try:
        getattr(trainer, method)(meta, metrics={})
        out["reached_engine"] = False
    except PassReached as reached:
        out.update(pass_digest(case, reached))
    if case.calls:
        name, extra_info, rows = case.calls[0]
        out["method"] = name
        out["rows"] = rows
        for key, value in extra_info.items():
            if _plain(value) is not NOT_PLAIN:
                out[f"trainer_sent.{key}"] = _plain(value)
    return out


def pass_digest(case: Case, reached: PassReached) -> dict[str, Any]:
    from tensordict import NonTensorData

    roles = {id(getattr(w, "engine", None)): r for r, w in worker_roles(case).items()}
    out: dict[str, Any] = {
        "engine": roles.get(id(reached.engine), "?"),
        "adapter_disabled": reached.adapter_disabled,
        "at_engine.rows_per_gpu": int(reached.data.batch_size[0]),
    }
    for key in sorted(reached.data.keys()):
        value = reached.data.get(key)
        if isinstance(value, NonTensorData) and _plain(value.data) is not NOT_PLAIN:
            out[f"at_engine.{key}"] = _plain(value.data)
    if out.get("at_engine.use_dynamic_bsz") is False:  # split by count: the engine's own split, run here
        from verl.workers.engine.utils import prepare_micro_batches  # transformer_impl.py:737

        try:
            micro_batches, _ = prepare_micro_batches(data=reached.data)
            out["at_engine.micro_batch_rows"] = [int(batch.batch_size[0]) for batch in micro_batches]
        except Exception as exc:  # the engine would fail here too, at the first step
            out["at_engine.micro_batch_error"] = f"{type(exc).__name__}: {exc}"
    return out


def worker_roles(case: Case) -> dict[str, Any]:
    """The TrainingWorkers that hold an engine, by role."""
    roles = {}
    for worker in case.workers.values():
        for role in ("actor", "ref"):
            if getattr(worker, role, None) is not None:
                roles[role] = getattr(worker, role)
        if hasattr(worker, "engine_config"):  # the critic's TrainingWorker itself
            roles["critic"] = worker
    return roles


# ----------------------------------------------------------------------------------------------------------
# The patches, each the Ray / GPU / model / vLLM boundary of a piece of verl that otherwise runs as is.
# ----------------------------------------------------------------------------------------------------------
VLLM_LORA_STEP = (
    "validate_config's last step, vLLM's LoRA rank table (get_vllm_max_lora_rank), imports vLLM, which is "
    "not installed here; every earlier check passed"
)


def _only_vllm_is_missing(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    in_lora_step = any(
        f.name == "validate_config" and "get_vllm_max_lora_rank" in (f.line or "") for f in frames
    )
    return in_lora_step and "vllm" in f"{type(exc).__name__} {exc}".lower()


def tolerant_validate(case: Case, validate: Callable) -> Callable:
    """main_ppo.py:177 validate_config, all of it, but for its vLLM-only last step with LoRA."""

    def run(*args: Any, **kwargs: Any) -> None:
        try:
            validate(*args, **kwargs)
        except Exception as exc:
            if not _only_vllm_is_missing(exc):
                raise
            case.not_run = VLLM_LORA_STEP

    return run


@contextlib.contextmanager
def patched(case: Case) -> Iterator[None]:
    import ray
    import verl.trainer.main_ppo as main_ppo
    import verl.trainer.ppo.v1.agent_loop_tq as agent_loop_tq
    import verl.trainer.ppo.v1.trainer_base as trainer_base
    import verl.workers.config.model as model_config
    import verl.workers.engine_workers as engine_workers
    import verl.workers.rollout.llm_server as llm_server
    import verl.workers.rollout.router as router
    from verl.single_controller.ray.base import ResourcePoolManager
    from verl.workers.engine.base import EngineRegistry

    to_dataclass = engine_workers.omega_conf_to_dataclass
    fetch = trainer_base.PPOTrainer._fetch_one_gen_batch
    submit = trainer_base.PPOTrainer._submit_batch_to_rollout

    def counted_fetch(trainer: Any) -> Any:
        case.fetches += 1
        return fetch(trainer)

    def counted_submit(trainer: Any, batch: Any) -> int:
        case.submitted.append(len(batch))
        return submit(trainer, batch)

    node = {"NodeID": "0" * 56, "Alive": True, "Resources": {"CPU": 1.0}}
    patches = [
        # main_ppo.py: validate_config as is but vLLM's table; Ray is "initialized"; the TaskRunner runs here
        mock.patch.object(main_ppo, "validate_config", tolerant_validate(case, main_ppo.validate_config)),
        mock.patch.object(ray, "is_initialized", lambda: True),
        mock.patch.object(ray, "get", lambda refs, **kwargs: refs),
        mock.patch.object(ray, "nodes", lambda: [node]),
        mock.patch.object(main_ppo, "TaskRunnerV1", InProcessActorClass(main_ppo.TaskRunnerV1, case)),
        # trainer_base.py: the dataset (files never read), Ray's pools / worker groups / reward workers /
        # weight sync, and fit (one step's fetch and passes instead of training)
        mock.patch.object(trainer_base, "create_rl_dataset", probe_datasets(case)),
        mock.patch.object(ResourcePoolManager, "_check_resource_available", lambda self: None),
        mock.patch.object(trainer_base, "create_colocated_worker_cls", lambda class_dict: class_dict),
        mock.patch.object(trainer_base, "RayWorkerGroup", lambda **kw: InProcessWorkerGroup(case=case, **kw)),
        mock.patch.object(trainer_base, "RewardLoopManager", NoRewardWorkers),
        mock.patch.object(trainer_base, "CheckpointEngineManager", recording_checkpoint_manager(case)),
        mock.patch.object(trainer_base.PPOTrainer, "fit", probe_fit(case)),
        # wrappers that only count or record, around verl's own functions (which run as they are)
        mock.patch.object(trainer_base.PPOTrainer, "_fetch_one_gen_batch", counted_fetch),
        mock.patch.object(trainer_base.PPOTrainer, "_submit_batch_to_rollout", counted_submit),
        # engine_workers.py: fake process group, the engine without its model, vLLM's rollout adapter
        mock.patch.object(engine_workers, "initialize_global_process_group_ray", fake_process_group),
        mock.patch.object(EngineRegistry, "new", engine_without_model(case, EngineRegistry.new)),
        mock.patch.object(engine_workers, "get_rollout_class", recording_rollout(case)),
        mock.patch.object(
            engine_workers, "omega_conf_to_dataclass", recording_to_dataclass(case, to_dataclass)
        ),
        # llm_server.py / agent_loop.py: vLLM replicas, the router and agent-loop workers are Ray actors
        mock.patch.object(llm_server, "get_rollout_replica_class", recording_replica(case)),
        mock.patch.object(router, "get_router_handle", lambda **kwargs: "router"),
        mock.patch.object(agent_loop_tq, "AgentLoopWorkerTQ", recording_agent_worker_class(case)),
        # speed only: each tokenizer is read once per run (every HFModelConfig reloads it)
        mock.patch.object(model_config, "hf_tokenizer", loaded_once(model_config.hf_tokenizer)),
        mock.patch.object(model_config, "hf_processor", loaded_once(model_config.hf_processor)),
        mock.patch.dict(os.environ),
    ]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        try:
            yield
        finally:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------------
# The digest of one case.
# ----------------------------------------------------------------------------------------------------------
REPLAY_FIELDS = (
    "trainer_mode", "train_batch_size", "gen_batch_size", "max_inflight_gen_batches", "poll_interval",
    "max_off_policy_threshold", "max_off_policy_strategy", "sync_refill_failed_groups",
    "filter_groups_metric",
)  # fmt: skip


def digest(case: Case) -> dict[str, Any]:
    trainer = case.runner.trainer
    out: dict[str, Any] = {}
    for part in (trainer_part, algorithm_part, data_part, worker_part, rollout_part, agent_loop_part):
        part(case, trainer, out)
    out.update(case.recorded)
    for prefix, values in case.passes.items():
        out.update({f"{prefix}.{key}": value for key, value in values.items()})
    return dict(sorted(out.items()))


def trainer_part(case: Case, trainer: Any, out: dict[str, Any]) -> None:
    """PPOTrainer.__init__ / _setup (trainer_base.py:120-137, 226-340, 788-848)."""
    import torch.distributed as dist

    out["trainer.class"] = type(trainer).__name__
    out["trainer.mode"] = trainer.trainer_mode
    out["trainer.parameter_sync_step"] = trainer.parameter_sync_step
    out["trainer.use_critic"] = bool(trainer.use_critic)
    out["trainer.use_reference_policy"] = bool(trainer.use_reference_policy)
    out["trainer.ref_in_actor"] = bool(trainer.ref_in_actor)
    out["trainer.roles"] = sorted(str(role) for role in trainer.role_worker_mapping)
    for name, spec in trainer.resource_pool_manager.resource_pool_spec.items():
        out[f"trainer.resource_pool.{name}"] = list(spec)
    out["trainer.world_size"] = dist.get_world_size()
    out["trainer.step_samples"] = step_samples(trainer)
    out["replay.class"] = type(trainer.replay_buffer).__name__
    for field in REPLAY_FIELDS:
        out[f"replay.{field}"] = _plain(getattr(trainer.replay_buffer, field, None))


def algorithm_part(case: Case, trainer: Any, out: dict[str, Any]) -> None:
    """verl's AlgoConfig for the job's `algorithm` block, and the in-reward KL controller the trainer keeps
    (trainer_base.py:126-127; used by apply_kl_penalty at :1754-1757)."""
    from verl.utils.config import omega_conf_to_dataclass

    flatten("algorithm", omega_conf_to_dataclass(trainer.config.algorithm), out, {"rollout_correction"})
    controller = getattr(trainer, "kl_ctrl_in_reward", None)
    out["algorithm.kl_ctrl_in_reward.class"] = type(controller).__name__ if controller else None
    out["algorithm.kl_ctrl_in_reward.value"] = getattr(controller, "value", None)


def loaders_part(case: Case, trainer: Any) -> None:
    """_init_dataloader's StatefulDataLoaders (trainer_base.py:742-759), as built."""
    for prefix, loader in (
        ("data.loader", trainer.train_dataloader),
        ("data.val_loader", trainer.val_dataloader),
    ):
        case.loaders[f"{prefix}.batch_size"] = loader.batch_size
        case.loaders[f"{prefix}.num_workers"] = loader.num_workers
        case.loaders[f"{prefix}.drop_last"] = loader.drop_last
    case.loaders["data.loader.sampler"] = type(trainer.train_dataloader.sampler).__name__


def data_part(case: Case, trainer: Any, out: dict[str, Any]) -> None:
    """The dataloaders, and one step's fetches (trainer_base.py:1466-1535)."""
    out.update(case.loaders)
    out["data.loader.fetches_per_step"] = case.fetches
    out["data.loader.prompts_per_step"] = case.submitted[0] if case.submitted else None


def engine_part(prefix: str, worker: Any, out: dict[str, Any]) -> None:
    """A TrainingWorker's configs as its engine got them (engine_workers.py:84-143), and the engine object."""
    flatten(f"{prefix}.engine", worker.engine_config, out)
    flatten(f"{prefix}.model", worker.model_config, out)
    engine = worker.engine
    out[f"{prefix}.engine_obj.class"] = type(engine).__name__
    mesh = getattr(engine, "device_mesh", None)
    if mesh is not None:
        out[f"{prefix}.engine_obj.mesh_shape"] = list(mesh.mesh.shape)
        out[f"{prefix}.engine_obj.mesh_dims"] = list(mesh.mesh_dim_names or ())
    out[f"{prefix}.engine_obj.dp_size"] = engine.get_data_parallel_size()
    out[f"{prefix}.engine_obj.lora"] = bool(getattr(engine, "_is_lora", False))
    out[f"{prefix}.engine_obj.param_offload"] = bool(getattr(engine, "_is_offload_param", False))
    out[f"{prefix}.engine_obj.optimizer_offload"] = bool(getattr(engine, "_is_offload_optimizer", False))


def loss_config(worker: Any) -> Any:
    """The ActorConfig / CriticConfig in a worker's loss (engine_workers.py:643, trainer_base.py:323)."""
    loss_fn = getattr(worker, "loss_fn", None)
    return getattr(loss_fn, "keywords", {}).get("config")


def worker_part(case: Case, trainer: Any, out: dict[str, Any]) -> None:
    for role, worker in worker_roles(case).items():
        engine_part(role, worker, out)
    for worker in case.workers.values():
        if hasattr(worker, "engine_config"):  # the critic TrainingWorker
            flatten("critic.config", loss_config(worker), out, OWN_DIGEST)
            continue
        out["actor.worker_role"] = worker.role
        flatten("actor.config", loss_config(worker), out, OWN_DIGEST)
        out["ref.built"] = worker.ref is not None
        ref_node = worker.config.ref
        ref_config = next((result for node, result in case.dataclass_calls if node is ref_node), None)
        if worker.ref is not None and ref_config is not None:  # engine_workers.py:545-553
            flatten("ref.config", ref_config, out, OWN_DIGEST)


def rollout_part(case: Case, trainer: Any, out: dict[str, Any]) -> None:
    """The RolloutConfig init_model gives the rollout (engine_workers.py:651-670), the replicas
    LLMServerManager makes (llm_server.py:434-470), the weight-sync engine (engine_workers.py:678-688)."""
    if case.rollouts:
        built = case.rollouts[0]
        flatten("rollout", built["config"], out)
        out["rollout.device_mesh.shape"] = list(built["device_mesh"].mesh.shape)
        out["rollout.device_mesh.dims"] = list(built["device_mesh"].mesh_dim_names)
    out["rollout.replicas"] = len(case.replicas)
    if case.replicas:
        replica = case.replicas[0]
        out["rollout.replica.world_size"] = replica.world_size
        out["rollout.replica.nnodes"] = replica.nnodes
        out["rollout.replica.gpus_per_replica_node"] = replica.gpus_per_replica_node
        out["rollout.replica.workers"] = len(replica.workers)
        out["rollout.replica.max_concurrency"] = replica.max_concurrency
    for worker in case.workers.values():
        engine = getattr(worker, "checkpoint_engine", None)
        if engine is not None:
            out["rollout.weight_sync.class"] = type(engine).__name__
            out["rollout.weight_sync.bucket_size"] = getattr(engine, "bucket_size", None)
    for manager in case.checkpoint_managers:
        out["rollout.weight_sync.manager_backend"] = manager["backend"]


def agent_loop_part(case: Case, trainer: Any, out: dict[str, Any]) -> None:
    """TaskRunnerV1.init_agent_loop_manager (main_ppo.py:111-131): AgentLoopManagerTQ's workers
    (agent_loop.py:1208-1228) and how one step's prompts are split among them (agent_loop_tq.py:243-257)."""
    manager = case.runner.agent_loop_manager
    out["agent_loop.manager_class"] = type(manager).__name__
    out["agent_loop.num_workers"] = len(manager.agent_loop_workers)
    out["agent_loop.chunk_rows"] = list(case.agent_chunks)


# ----------------------------------------------------------------------------------------------------------
# Cases.
# ----------------------------------------------------------------------------------------------------------
def _where(exc: BaseException) -> str:
    """The line that raised, relative to site-packages (verl/...) when it is there."""
    import verl

    frame = traceback.extract_tb(exc.__traceback__)[-1]
    site = os.path.dirname(os.path.dirname(verl.__file__))
    name = os.path.relpath(frame.filename, site) if frame.filename.startswith(site) else frame.filename
    return f"{name}:{frame.lineno}: {frame.line}"


def selected(config: Any, keys: list[str]) -> dict[str, Any]:
    """The composed value of each key (a `+` prefix ignored; None where the config has no such key): what
    verl reads for a key an override file sets or leaves to verl's default."""
    from omegaconf import OmegaConf

    found = {}
    for key in keys:
        value = OmegaConf.select(config, key.lstrip("+~"), default=None)
        found[key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return found


def run_case(compose: Callable, overrides: list[str], select: list[str] = ()) -> dict[str, Any]:
    import verl.trainer.main_ppo as main_ppo

    case = Case()
    out: dict[str, Any] = {"ok": False}
    try:
        config = compose("ppo_trainer", overrides=overrides)
        out["selected"] = selected(config, list(select))
        if not config.trainer.use_v1:
            raise ValueError("trainer.use_v1=false: the legacy trainer (main_ppo_v0.py) is not covered")
        with contextlib.redirect_stdout(sys.stderr), patched(case):  # verl prints; stdout carries the JSON
            main_ppo.main(config)  # hydra's main given a config runs the function on it (hydra/main.py:82)
            out["objects"] = digest(case)
        out["ok"] = True
    except Exception as exc:  # verl's refusal, or a piece this script could not run: that case's line says so
        out["error"] = f"{type(exc).__name__}: {exc} [{_where(exc)}]"[-3000:]
    if case.not_run:
        out["not_run"] = case.not_run
    return out


def main() -> int:
    install_stubs()
    import verl
    import verl.trainer.main_ppo  # verl's trainer, workers and engines, imported once
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    if sys.argv[1:2] == ["--cases"]:
        cases = json.load(sys.stdin)
    else:
        with open(sys.argv[1]) as handle:
            lines = [line.strip() for line in handle if line.strip() and not line.startswith("#")]
        cases = [{"name": sys.argv[1], "overrides": lines + sys.argv[2:]}]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        for case in cases:
            found = run_case(compose, case["overrides"], case.get("select", []))
            print(json.dumps({"name": case["name"], **found}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
