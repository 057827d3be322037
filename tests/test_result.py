from autotune.probe.classify import classify
from autotune.units import GIB

OK_RESULT = {"status": "ok"}


def test_all_ranks_ok():
    assert classify([0, 0], [OK_RESULT, OK_RESULT], False, GIB, None, "cpu")[0] == "ok"


def test_real_oom_on_one_rank_explains_the_others_hang():
    status, kind, _ = classify([3, -9], [{"status": "oom", "oom_kind": "cuda"}, None], True, 0, None, "cuda")
    assert (status, kind) == ("oom", "cuda")


def test_timeout_wins_over_exit_codes_of_killed_ranks():
    assert classify([-9], [None], True, 0, None, "cpu")[0] == "timeout"


def test_crash_names_the_signal():
    status, _, message = classify([0, -11], [OK_RESULT, None], False, 0, None, "cpu")
    assert status == "crashed" and "SIGSEGV" in message and "rank 1" in message


def test_exit_zero_without_result_is_a_crash():
    assert classify([0], [None], False, 0, None, "cpu")[0] == "crashed"


def test_emulated_budget_on_cpu():
    status, kind, message = classify([0], [OK_RESULT], False, 2 * GIB, GIB, "cpu")
    assert (status, kind) == ("oom", "emulated") and "emulated" in message


def test_budget_on_cuda_is_enforced_by_the_allocator_not_compared():
    assert classify([0], [OK_RESULT], False, 2 * GIB, GIB, "cuda")[0] == "ok"
