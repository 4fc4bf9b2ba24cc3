"""``monitor:`` in prudent.yaml: defaults, tuning, user rules, and errors that name the fix."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from prudent.kernel.errors import ConfigError
from prudent.monitor import MonitorSettings, unregister_rule
from prudent.monitor.monitor import build_rules
from prudent.monitor.registry import RULES
from prudent.wiring.config import load_settings


def settings_from(tmp_path: Path, text: str) -> MonitorSettings:
    path = tmp_path / "prudent.yaml"
    path.write_text(text)
    return load_settings(path, environ={}).monitor


def test_every_rule_is_on_by_default_with_the_documented_actions() -> None:
    rules = build_rules(MonitorSettings())
    assert list(rules) == list(RULES)
    actions = {name: rule.settings.action for name, rule in rules.items()}
    assert actions == {
        "non_finite": ["stop"], "loss_spike": ["skip", "rollback"],
        "exploding_gradient": ["skip", "stop"], "vanishing_gradient": ["stop"],
        "loss_not_decreasing": ["stop"], "divergence": ["stop"], "overfitting": ["stop"],
        "early_stopping": ["stop"], "update_ratio": ["stop"], "dead_activations": ["stop"],
        "stalled": ["stop"], "memory_growth": ["stop"]}


def test_yaml_tunes_disables_and_chains_actions(tmp_path: Path) -> None:
    settings = settings_from(tmp_path, (
        "monitor:\n"
        "  check_every_steps: 5\n"
        "  rules:\n"
        "    exploding_gradient: {factor: 20, action: [alert, reduce_lr]}\n"
        "    loss_not_decreasing: {enabled: false}\n"
        "    stalled: {timeout_s: 10min, grace_s: 90s}\n"
        "  actions:\n"
        "    reduce_lr: {factor: 0.3, min_lr: 1.0e-6}\n"))
    rules = build_rules(settings)
    assert "loss_not_decreasing" not in rules
    assert rules["exploding_gradient"].settings.factor == 20  # type: ignore[attr-defined]
    assert rules["exploding_gradient"].settings.action == ["alert", "reduce_lr"]
    assert (rules["stalled"].settings.timeout_s, rules["stalled"].settings.grace_s) == (600, 90)  # type: ignore[attr-defined]
    assert settings.check_every_steps == 5 and settings.actions.reduce_lr.factor == 0.3


@pytest.mark.parametrize(("text", "expected"), [
    ("monitor: {rules: {explodng_gradient: {factor: 5}}}",
     ("prudent.yaml: unknown key 'monitor.rules.explodng_gradient' (did you mean "
      "'monitor.rules.exploding_gradient'?); allowed: non_finite, loss_spike, "
      "exploding_gradient, vanishing_gradient")),
    ("monitor: {rules: {divergence: {window: -5}}}",
     ("prudent.yaml: monitor.rules.divergence.window=-5 is invalid: Input should be greater "
      "than or equal to 4")),
    ("monitor: {rules: {exploding_gradient: {factor: ten}}}",
     ("prudent.yaml: monitor.rules.exploding_gradient.factor='ten' is invalid: Input should be "
      "a valid number")),
    ("monitor: {rules: {non_finite: {action: halt}}}",
     ("prudent.yaml: monitor.rules.non_finite.action.0='halt' is invalid: Input should be "
      "'stop', 'reduce_lr', 'alert', 'capture', 'prune', 'skip' or 'rollback'")),
    ("monitor: {rules: {stalled: {timeout_s: soon}}}",
     ("monitor.rules.stalled.timeout_s='soon' is invalid: duration 'soon' is invalid: write a "
      "number with a unit")),
    ("monitor: {check_every_steps: 0}",
     ("prudent.yaml: monitor.check_every_steps=0 is invalid: Input should be greater than or "
      "equal to 1")),
    ("monitor: {check_every_steps: 20, max_check_every_steps: 10}",
     "max_check_every_steps=10 is below check_every_steps=20: make it at least that"),
    ("monitor: {grad_norm_every_steps: 0}",
     "monitor.grad_norm_every_steps=0 is invalid: use a whole number of steps >= 1, or auto"),
    ("monitor: {plugins: [no_such_module_xyz]}",
     "cannot import rule plugin 'no_such_module_xyz'"),
])
def test_bad_monitor_settings_are_one_clear_line(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        settings_from(tmp_path, text + "\n")
    assert expected in str(error.value) and "\n" not in str(error.value)


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module in the project folder that registers a rule, as monitor.plugins expects."""
    (tmp_path / "my_rules.py").write_text(
        "from prudent.monitor import Finding, rule\n\n"
        "@rule('loss_above', threshold=5.0, action='alert')\n"
        "def loss_above(window, settings):\n"
        "    for step, loss in window.losses():\n"
        "        if loss is not None and loss > settings.threshold:\n"
        "            return Finding(step, loss, settings.threshold, f'loss {loss} at step {step}')\n"
        "    return None\n")
    monkeypatch.chdir(tmp_path)
    yield "my_rules"
    unregister_rule("loss_above")
    sys.modules.pop("my_rules", None)


def test_a_plugin_rule_is_validated_with_its_own_types(tmp_path: Path, plugin_module: str) -> None:
    settings = settings_from(tmp_path, f"monitor: {{plugins: [{plugin_module}], "
                                       "rules: {loss_above: {threshold: 3.5}}}\n")
    assert build_rules(settings)["loss_above"].settings.threshold == 3.5  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"monitor.rules.loss_above.threshold='high' is invalid"):
        settings_from(tmp_path, f"monitor: {{plugins: [{plugin_module}], "
                                "rules: {loss_above: {threshold: high}}}\n")


def test_the_environment_can_switch_monitoring_off() -> None:
    assert load_settings(environ={"PRUDENT_MONITOR": "0"}).monitor.enabled is False


def test_the_webhook_secret_never_shows_in_a_repr_or_a_dump(tmp_path: Path) -> None:
    secret = "https://hooks.example.com/services/T0/B0/s3cr3t-token"
    settings = settings_from(tmp_path, f"monitor: {{actions: {{alert: {{webhook_url: '{secret}'}}}}}}\n")
    assert settings.actions.alert.url() == secret
    assert "s3cr3t" not in repr(settings) and "s3cr3t" not in settings.model_dump_json()


def test_the_public_names_are_few_and_sorted() -> None:
    import prudent.monitor

    assert prudent.monitor.__all__ == sorted(prudent.monitor.__all__)
    assert all(hasattr(prudent.monitor, name) for name in prudent.monitor.__all__)
