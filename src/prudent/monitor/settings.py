"""``monitor:`` in prudent.yaml: cadences, the rules (built-in and registered) and the actions.

::

    monitor:
      check_every_steps: 10            # rules see host values every 10 steps
      rules:
        exploding_gradient: {factor: 20, action: [alert, reduce_lr]}
        loss_not_decreasing: {enabled: false}
        my_rule: {threshold: 3.0}      # registered with @prudent.monitor.rule
      actions:
        reduce_lr: {factor: 0.5, cooldown_steps: 200, min_lr: 1.0e-6}
        alert: {webhook_url_env: PRUDENT_ALERT_WEBHOOK}

A rule that is not listed runs with its defaults. An unknown rule name, a negative window or a
threshold of the wrong type is an error before anything starts.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    create_model,
    field_validator,
    model_validator,
)

from prudent.launch.spec import ENV_ALERT_WEBHOOK
from prudent.monitor.base import RuleSettings
from prudent.monitor.registry import RULES, import_plugins
from prudent.monitor.rules import BUILTIN_RULES

__all__ = ["ActionSettings", "AlertSettings", "MonitorSettings", "ReduceLRSettings",
           "RollbackSettings", "RulesSettings"]


class ReduceLRSettings(BaseModel):
    """``monitor.actions.reduce_lr``."""

    model_config = ConfigDict(extra="forbid")

    factor: float = Field(0.5, gt=0, lt=1, description="Multiply every param group's learning "
                          "rate by this (Keras' ReduceLROnPlateau: 0.1, a harsher cut).")
    cooldown_steps: int = Field(200, ge=0, description="Steps after a reduction during which "
                                "another request is ignored, so two rules do not compound.")
    min_lr: float = Field(1e-7, ge=0, description="Never go below this learning rate.")


class RollbackSettings(BaseModel):
    """``monitor.actions.rollback``: what a rollback does after a loss spike (PaLM, section 5.1:
    restart ~100 steps before the spike and skip 200-500 batches)."""

    model_config = ConfigDict(extra="forbid")

    skip_batches: int = Field(100, ge=0, description="Batches of run.batches(...) skipped after "
                              "the weights are put back (the data between the checkpoint and the "
                              "spike is never seen again either: the data is not rewound).")
    lr_factor: float = Field(1.0, gt=0, le=1, description="Multiply the learning rate by this "
                             "after each rollback (OPT-175B restarted with a lower one; 1: keep).")
    max_rollbacks: int = Field(3, ge=0, description="After this many rollbacks in a run, the "
                               "next spike stops it (with a checkpoint).")
    max_steps_back: int | None = Field(None, ge=1, description="A rollback goes back at most "
                                       "this many steps before the spike began: from an older "
                                       "checkpoint it would be a restart, not a repair, and the "
                                       "run stops instead (with a checkpoint). Default: a "
                                       "tenth of the planned run, at least 100 steps (PaLM: "
                                       "~100); no limit when the length is unknown.")


class AlertSettings(BaseModel):
    """``monitor.actions.alert``: where a rule firing is announced besides the console and the
    run's events (both always)."""

    model_config = ConfigDict(extra="forbid")

    webhook_url: SecretStr | None = Field(None, description="POST each firing as JSON to this "
                                          "URL (Slack-style webhooks carry a secret in the "
                                          "URL: it is never logged or stored).")
    webhook_url_env: str = Field(ENV_ALERT_WEBHOOK, description="Environment variable "
                                 "read for the URL when webhook_url is not set (keeps the "
                                 "secret out of prudent.yaml).")
    timeout_s: float = Field(10.0, gt=0, description="Per POST; a failed POST is recorded as an "
                                  "event and training goes on.")

    def url(self) -> str | None:
        if self.webhook_url is not None:
            return self.webhook_url.get_secret_value()
        return os.environ.get(self.webhook_url_env) or None


class ActionSettings(BaseModel):
    """``monitor.actions``: the settings of actions that have any."""

    model_config = ConfigDict(extra="forbid")

    reduce_lr: ReduceLRSettings = Field(default_factory=ReduceLRSettings,
                                        description="How reduce_lr lowers the learning rate.")
    alert: AlertSettings = Field(default_factory=AlertSettings,
                                 description="Where firings are announced.")
    rollback: RollbackSettings = Field(default_factory=RollbackSettings,
                                       description="How a rollback repairs a loss spike.")


def _builtin_fields() -> dict[str, Any]:
    return {cls.name: (cls.Settings, Field(default_factory=cls.Settings,
                                           description=(cls.__doc__ or "").split("\n")[0]))
            for cls in BUILTIN_RULES}


RulesSettings = create_model("RulesSettings", __config__=ConfigDict(extra="forbid"),
                             __doc__="``monitor.rules``: one entry per rule, by name.",
                             **_builtin_fields())


class MonitorSettings(BaseModel):
    """``monitor:`` in prudent.yaml."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Run the monitoring rules.")
    loss_key: str = Field("loss", description="The metric of run.step(...) that is the "
                          "training loss.")
    check_every_steps: int = Field(10, ge=1, description="Rules see the statistics of this many "
                                   "steps at once: one device-to-host transfer per check. A "
                                   "non-finite loss already on the host (CPU) is judged at the "
                                   "step it appears.")
    max_check_every_steps: int | None = Field(None, ge=1, description="When a check would take "
                                              "more than overhead_budget of the step time (tiny "
                                              "models, fast steps), checks come rarer, up to every "
                                              "this many steps (default 10 x check_every_steps).")
    sample_every_steps: int = Field(100, ge=1, description="Per-layer gradient norms, update "
                                    "ratios, activation statistics and memory, every this many "
                                    "steps.")
    memory_every_s: float = Field(30.0, gt=0, description="Memory is also sampled at the "
                                  "first check this long after the previous sample (slow "
                                  "steps), besides every ~1% of the planned run.")
    size_to_run: bool = Field(True, description="Once the run's planned length is known "
                              "(run.epochs(n) x the loader's length, or run.steps(n)), size the "
                              "rules' warm-ups, windows and sampling so a verdict is possible "
                              "within about a tenth of the run; settings you set yourself are "
                              "kept.")
    grad_norm_every_steps: int | Literal["auto"] = Field(
        "auto", description="Global gradient norm every this many steps; auto: every step "
        "unless that costs more than overhead_budget of the step time, then as often as the "
        "budget allows (on a CPU a norm costs tens of microseconds).")
    overhead_budget: float = Field(0.002, gt=0, le=1, description="The share of step time the "
                                   "gradient norm may take when grad_norm_every_steps is auto, "
                                   "and, apart, the share the rule checks may take. More would "
                                   "make them rarer (tiny models, millisecond steps), within "
                                   "their maximum intervals; on steps of tens of ms neither is "
                                   "stretched.")
    plugins: list[str] = Field(default_factory=list, description="Modules imported before the "
                               "rules are validated, to register your own rules (so `prudent "
                               "run` knows them too).")
    rules: RulesSettings = Field(default_factory=RulesSettings,  # type: ignore[valid-type]
                                 description="Per-rule settings, by rule name.")
    actions: ActionSettings = Field(default_factory=ActionSettings,
                                    description="Settings of the actions.")

    @model_validator(mode="after")
    def _check_interval_range(self) -> MonitorSettings:
        if self.max_check_every_steps is None:
            # not through setattr: the field stays unset, so the monitor may size it to the run
            self.__dict__["max_check_every_steps"] = 10 * self.check_every_steps
        elif self.max_check_every_steps < self.check_every_steps:
            raise ValueError(f"max_check_every_steps={self.max_check_every_steps} is below "
                             f"check_every_steps={self.check_every_steps}: make it at least that")
        return self

    @field_validator("grad_norm_every_steps")
    @classmethod
    def _positive_stride(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("use a whole number of steps >= 1, or auto")
        return value

    @field_validator("plugins")
    @classmethod
    def _import_plugins(cls, value: list[str]) -> list[str]:
        import_plugins(value)  # before `rules` is validated: fields validate in order
        return value

    @field_validator("rules", mode="before")
    @classmethod
    def _known_rules(cls, value: Any) -> Any:
        if isinstance(value, BaseModel):
            value = value.model_dump()
        return _rules_model().model_validate(value)

    def rule_settings(self) -> dict[str, RuleSettings]:
        """Every registered rule's settings: from the file, else its defaults."""
        given = {name: getattr(self.rules, name) for name in type(self.rules).model_fields}
        return {name: given.get(name) or cls.Settings() for name, cls in RULES.items()}


def _rules_model() -> type[BaseModel]:
    """RulesSettings plus the rules registered since (their names become valid keys)."""
    extra = {name: (cls.Settings, Field(default_factory=cls.Settings))
             for name, cls in RULES.items() if name not in RulesSettings.model_fields}
    if not extra:
        return RulesSettings
    return create_model("RulesSettings", __base__=RulesSettings, **extra)
