from __future__ import annotations

import pytest

from prudent.kernel.errors import ConfigError
from prudent.kernel.units import parse_duration_s, validate_run_id


@pytest.mark.parametrize("run_id", ["a", "digits-20261202-1", "A.b_c-9"])
def test_valid_run_ids(run_id: str) -> None:
    assert validate_run_id(run_id) == run_id


@pytest.mark.parametrize("run_id", ["a/b", "../x", "", "-x", "a b", "x" * 129, ".."])
def test_invalid_run_ids_name_the_value_and_the_rule(run_id: str) -> None:
    with pytest.raises(ConfigError, match="run id .* is invalid: use 1-128 letters"):
        validate_run_id(run_id)


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("10min", 600), ("1.5h", 5400),
                                               (30, 30), ("250ms", 0.25), ("2d", 172800)])
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration_s(text) == pytest.approx(seconds)


def test_bad_duration_shows_examples() -> None:
    with pytest.raises(ConfigError, match="e.g. '90s', '10min', '2h'"):
        parse_duration_s("soon")
