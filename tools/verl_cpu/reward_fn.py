"""A reward that varies between a tiny random model's samples, for the verl-on-CPU experiment (README.md).

GSM8K's rule reward gives a 2-layer random Llama 0 on every sample, so every GRPO advantage is 0 and the
actor update has no gradient: a run "completes" without training anything. This reward (the share of
distinct characters in the decoded response) differs between the n samples of a prompt, so the update
and the weight sync that follows carry a real change. Select it with
    reward.custom_reward_function.path=tools/verl_cpu/reward_fn.py
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    if not solution_str:
        return 0.0
    return len(set(solution_str)) / len(solution_str)
