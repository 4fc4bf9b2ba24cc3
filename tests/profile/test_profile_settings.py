"""``profile:`` settings and the --profile-steps window: bad input names the value and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from prudent.kernel.errors import ConfigError
from prudent.profile import ProfileSettings, StepWindow, parse_step_window
from prudent.wiring.config import load_settings


def test_window_is_start_exclusive_stop_inclusive_steps() -> None:
    assert parse_step_window("100:110") == StepWindow(100, 110)
    assert parse_step_window(" 0 : 5 ") == StepWindow(0, 5) and str(StepWindow(0, 5)) == "0:5"


@pytest.mark.parametrize(("text", "message"), [
    ("10:5", "--profile-steps '10:5' is inverted: STOP must be greater than START, e.g. 10:20"),
    ("5:5", "--profile-steps '5:5' is empty: STOP must be greater than START, e.g. 5:15"),
    ("100-110", "--profile-steps '100-110' is invalid: write START:STOP with whole step numbers"),
    ("-1:5", "--profile-steps '-1:5' is invalid"),
    ("", "--profile-steps '' is invalid"),
])
def test_bad_window_names_the_value_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_step_window(text)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_profiling_is_on_by_default_with_documented_thresholds(home: Path) -> None:
    settings = load_settings(environ={}).profile
    assert settings.enabled and settings.steps is None and settings.interval_s == 5.0
    assert settings.thresholds.input_bound_pct == 20.0
    assert all(field.description for field in ProfileSettings.model_fields.values())


def test_environment_sets_the_window_and_turns_profiling_off(home: Path) -> None:
    settings = load_settings(environ={"PRUDENT_PROFILE_STEPS": "3:9", "PRUDENT_PROFILE": "0"})
    assert settings.profile.window == StepWindow(3, 9) and not settings.profile.enabled


def test_bad_window_in_the_environment_names_the_variable(home: Path) -> None:
    with pytest.raises(ConfigError, match=r"^PRUDENT_PROFILE_STEPS: profile.steps='9:2' is "
                       r"invalid: inverted: STOP must be greater than START"):
        load_settings(environ={"PRUDENT_PROFILE_STEPS": "9:2"})


def test_thresholds_come_from_prudent_yaml_and_unknown_ones_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "prudent.yaml"
    path.write_text("profile: {steps: '10:20', thresholds: {input_bound_pct: 30}}\n")
    profile = load_settings(path, environ={}).profile
    assert profile.thresholds.input_bound_pct == 30 and profile.window == StepWindow(10, 20)
    path.write_text("profile: {thresholds: {input_bound: 30}}\n")
    with pytest.raises(ConfigError, match=r"unknown key 'profile.thresholds.input_bound' \(did you mean "
                       r"'profile.thresholds.input_bound_pct'\?\); allowed: min_steps, input_bound_pct"):
        load_settings(path, environ={})
