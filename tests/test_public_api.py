from __future__ import annotations

import prudent


def test_exported_members_are_exactly_the_public_api() -> None:
    assert prudent.__all__ == sorted(prudent.__all__)
    assert set(prudent.__all__) == {
        "Component", "ConfigError", "Event", "ExitCode", "PrudentError", "Run", "StopRun",
        "__version__", "init", "tune"}
    for name in prudent.__all__:
        assert hasattr(prudent, name)


def test_stop_run_carries_its_reason_and_is_not_a_prudent_error() -> None:
    stop = prudent.StopRun("rule:non_finite", "loss is NaN at step 3")
    assert stop.reason == "rule:non_finite" and stop.exit_code == 3
    assert not isinstance(stop, prudent.PrudentError)


def test_exit_codes_are_distinct() -> None:
    codes = [int(code) for code in prudent.ExitCode]
    assert len(codes) == len(set(codes))
