#!/usr/bin/env bash
# The verl-on-CPU experiment (README.md): main_ppo on the tiny job make_assets.py wrote into $WORK.
#   WORK=/tmp/verl-cpu tools/verl_cpu/run.sh LOGNAME [extra overrides...]
#     -> $WORK/logs/LOGNAME.log (console) and $WORK/logs/LOGNAME.metrics.jsonl (verl's file logger)
# VERL_PYTHON picks the interpreter (default: .venv-verl beside tools/); TMO bounds the run in seconds.
# $WORK/pydeps holds verl's verl-core extras that .venv-verl lacks (pip install --target, README.md).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
WORK="${WORK:-/tmp/verl-cpu}"
log=$1; shift
# Run from an empty folder: the driver and Ray's workers put the cwd on sys.path, so a stray cpu_platform.py
# in $WORK would shadow the one here.
mkdir -p "$WORK/logs" "$WORK/cwd" && cd "$WORK/cwd"
export PYTHONPATH="$here:$WORK/pydeps" HYDRA_FULL_ERROR=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export VERL_USE_EXTERNAL_MODULES=cpu_platform VERL_PLATFORM=cpu VERL_ENGINE_DEVICE=cuda
metrics="$WORK/logs/$log.metrics.jsonl"   # verl's file logger: one JSON line per step (utils/tracking.py:529)
timeout "${TMO:-480}" "${VERL_PYTHON:-$repo/.venv-verl/bin/python}" -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files=$WORK/train.parquet data.val_files=$WORK/val.parquet \
  data.train_batch_size=2 data.max_prompt_length=64 data.max_response_length=16 \
  data.filter_overlong_prompts=False \
  actor_rollout_ref.model.path=$WORK/model \
  actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
  actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.strategy=fsdp2 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \
  actor_rollout_ref.rollout.n=2 actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  algorithm.use_kl_in_reward=False \
  trainer.device=cpu trainer.n_gpus_per_node=1 trainer.nnodes=1 \
  trainer.total_training_steps=2 trainer.total_epochs=2 trainer.val_before_train=False \
  trainer.test_freq=-1 trainer.save_freq=-1 trainer.resume_mode=disable \
  trainer.logger='[console,file]' trainer.project_name=cpu trainer.experiment_name=cpu \
  trainer.default_local_dir=$WORK/ckpt hydra.run.dir=$WORK/hydra \
  +ray_kwargs.ray_init._temp_dir=$WORK/ray \
  ++ray_kwargs.ray_init.num_cpus=16 +ray_kwargs.ray_init.num_gpus=1 \
  +ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=cpu_platform \
  +ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cpu \
  +ray_kwargs.ray_init.runtime_env.env_vars.VERL_ENGINE_DEVICE=cuda \
  +ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=$metrics \
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
  actor_rollout_ref.rollout.name=hf_cpu actor_rollout_ref.rollout.agent.num_workers=1 \
  reward.num_workers=1 data.dataloader_num_workers=0 \
  trainer.v1.sampler.custom_sampler.path=$here/quick_poll.py \
  trainer.v1.sampler.custom_sampler.name=QuickPollReplayBuffer \
  "$@" > "$WORK/logs/$log.log" 2>&1
echo "rc=$?" >> "$WORK/logs/$log.log"
