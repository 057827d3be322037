"""verl's sync replay buffer, polling every 50 ms instead of every 2 s (verl-on-CPU experiment, README.md).

In the V1 sync trainer the "gen" phase is `ReplayBuffer.sample`, which sleeps `poll_interval` (2.0 s, not in
the config: trainer/ppo/v1/replay_buffer.py:144, slept at :409) between checks for finished rollouts. On the
tiny CPU job generation takes a fraction of that, so timing_s/gen and timing_s/step read 2 s of sleep.
verl's extension point for the sampler (trainer.v1.sampler.custom_sampler.{path,name},
trainer/ppo/v1/trainer_base.py:139) loads this subclass instead; it changes nothing but the interval.
A custom sampler is not given the DAPO arguments (trainer_base.py:163): keep algorithm.filter_groups off.
"""

import os

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer


class QuickPollReplayBuffer(ReplayBuffer):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("poll_interval", float(os.environ.get("VERL_CPU_POLL_INTERVAL", "0.05")))
        super().__init__(*args, **kwargs)
