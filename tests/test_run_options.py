import pytest

from autotune.errors import UserError
from autotune.search.prepare import default_study_name, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("8h", 28800), ("90m", 5400), ("1h30m", 5400), ("45s", 45), ("120", 120), ("1d", 86400), ("0.5h", 1800)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "8 hours", "h", "1h and 5m"])
def test_bad_durations(text):
    with pytest.raises(UserError, match="--time-budget"):
        parse_duration(text)


def test_study_name_from_a_model_directory():
    assert (
        default_study_name("cpu-tiny", "/models/My Model/", 2, "0a1b2c3d")
        == "cpu-tiny-My-Model-2gpu-0a1b2c3d"
    )
