from __future__ import annotations

import pytest

from prudent.kernel.errors import ConfigError
from prudent.kernel.units import parse_hours, parse_usd


@pytest.mark.parametrize(("text", "usd"), [("$40", 40.0), ("40", 40.0), (12.5, 12.5),
                                           ("7.5usd", 7.5), ("$ 0", 0.0)])
def test_dollars_parse_in_one_place(text: str | float, usd: float) -> None:
    assert parse_usd(text) == usd


@pytest.mark.parametrize("text", ["-5", "$-1", "lots", True])
def test_bad_dollars_name_value_reason_and_fix(text: object) -> None:
    with pytest.raises(ConfigError, match="budget_usd .* is invalid: .*e.g. '\\$40'"):
        parse_usd(text, "budget_usd")  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "hours"), [(12, 12.0), ("1.5", 1.5), ("90min", 1.5), ("2h", 2.0)])
def test_hours_take_a_bare_number_as_hours(text: str | int, hours: float) -> None:
    assert parse_hours(text) == hours


@pytest.mark.parametrize("text", [0, "-1", "soon"])
def test_bad_hours_are_errors(text: object) -> None:
    with pytest.raises(ConfigError, match="max_hours .* is invalid"):
        parse_hours(text, "max_hours")  # type: ignore[arg-type]
