"""A study's results: best configuration, the trials, parameter importances, plots.

``summarize`` is the JSON of ``prudent study NAME --json`` (and what ``prudent tune`` prints
at the end); trial states are ``complete``, ``pruned``, ``failed``, ``running``, ``waiting``.
``unit`` says what the trials reported at: ``epoch`` (a loop with ``run.epochs``) or ``step``
(an iteration loop); the table and the totals count in that unit. A trial whose machine was
lost and whose run another trial resumed (Optuna's retry) has ``resumed_as``; the retry has
``retry_of``: the two are one run, counted once in ``cost_usd_total`` and ``trials_counted``.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

    from prudent.wiring.config import ProjectSettings

__all__ = ["print_summary", "reported_unit", "summarize", "write_plots"]

_STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running",
           "WAITING": "waiting"}


def summarize(study: optuna.Study, settings: ProjectSettings | None = None) -> dict[str, Any]:
    """Everything ``prudent study --json`` shows; costs of unfinished trials come from the store."""
    from prudent.tune.machines import chain_costs, counted, retry_of, superseded
    from prudent.tune.study import meta_of

    meta = meta_of(study)
    live = _live_runs(study, settings)
    unit = reported_unit(study)
    frozen = study.get_trials()
    resumed_as = superseded(frozen)
    # a lost trial's cost is what its machine last published: its run is now the retry's
    trials = [_trial(t, None if t.number in resumed_as else live.get(t.user_attrs.get(
        "run_id", "")), unit) for t in frozen]
    for row, t in zip(trials, frozen):
        row["retry_of"], row["resumed_as"] = retry_of(t), resumed_as.get(t.number)
    cost_of = {t.number: row["cost_usd"] for row, t in zip(trials, frozen)}
    runs = chain_costs(frozen, lambda t: cost_of[t.number])
    best = _best(study)
    counts: dict[str, int] = {}
    for t in trials:
        counts[t["state"]] = counts.get(t["state"], 0) + 1
    return {
        "study": study.study_name, "objective": meta.get("objective"),
        "direction": meta.get("direction"), "pruner": (meta.get("pruner") or {}).get("name"),
        "best_value": best.value if best else None,
        "best_params": dict(best.params) if best else None,
        "best_trial": best.number if best else None,
        "best_run_id": best.user_attrs.get("run_id") if best else None,
        "counts": counts, "unit": unit, "trials_counted": len(counted(frozen)),
        "resumed": len(resumed_as),
        "epochs_total": sum(t["epochs"] or 0 for t in trials),
        "epochs_without_pruning": _full_epochs(trials, meta.get("max_epochs")),
        "steps_total": sum(t["steps"] or 0 for t in trials),
        "steps_without_pruning": _full_epochs(trials, meta.get("max_steps"), "steps"),
        "cost_usd_total": round(sum(usd for usd, _ in runs), 6),
        "importances": _importances(study),
        "trials": trials,
    }


def _full_epochs(trials: list[dict[str, Any]], max_epochs: int | None,
                 key: str = "epochs") -> int | None:
    """What the finished trials would have cost in epochs (or steps) had none been pruned."""
    full = max_epochs or max((t[key] for t in trials if t["state"] == "complete"), default=0)
    finished = sum(1 for t in trials if t["state"] in ("complete", "pruned"))
    return full * finished if full else None


def reported_unit(study: optuna.Study) -> str:
    """``step`` when a trial reported at optimizer steps (an iteration loop), else ``epoch``."""
    from prudent.tune.trial import UNIT_ATTR

    units = {t.user_attrs.get(UNIT_ATTR) for t in study.get_trials(deepcopy=False)}
    return "step" if "step" in units else "epoch"


def _best(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    try:
        return study.best_trial
    except ValueError:  # no completed trial yet
        return None


def _trial(t: optuna.trial.FrozenTrial, run: dict[str, Any] | None,
           unit: str = "epoch") -> dict[str, Any]:
    attrs = t.user_attrs
    value = t.value if t.value is not None and math.isfinite(t.value) else None
    if value is None and t.intermediate_values:
        last = t.intermediate_values[max(t.intermediate_values)]
        value = last if math.isfinite(last) else None
    cost = attrs.get("cost_usd")
    if cost is None:  # still running, or lost with its machine: the spend last known
        cost = max(float(attrs.get("spent_usd") or 0.0), float((run or {}).get("cost_usd") or 0.0))
    last_reported = max(t.intermediate_values) if t.intermediate_values else 0
    epochs = attrs.get("epochs")
    if epochs is None:  # still running: the last report, or the record's
        epochs = last_reported if unit == "epoch" else (run or {}).get("epoch") or 0
    steps = attrs.get("steps")
    if steps is None:
        steps = (run or {}).get("step") or (last_reported if unit == "step" else 0)
    return {"number": t.number, "state": _STATES.get(t.state.name, t.state.name.lower()),
            "value": value, "params": dict(t.params), "run_id": attrs.get("run_id"),
            "cost_usd": float(cost or 0.0), "epochs": int(epochs), "steps": int(steps),
            "reported": len(t.intermediate_values),
            "pruned_by": attrs.get("pruned_by") if t.state.name == "PRUNED" else None,
            "error": attrs.get("error"),
            "duration_s": t.duration.total_seconds() if t.duration else None}


def _live_runs(study: optuna.Study, settings: ProjectSettings | None) -> dict[str, dict[str, Any]]:
    """Run records of trials still without a final cost (running ones)."""
    from prudent.store.database import Store

    ids = [t.user_attrs["run_id"] for t in study.get_trials(deepcopy=False)
           if "run_id" in t.user_attrs and "cost_usd" not in t.user_attrs]
    if not ids or settings is None:
        return {}
    if settings.store.url is None and not (Path(settings.store.home) / "prudent.db").exists():
        return {}
    store = Store.open(settings.store)
    try:
        return {i: r for i in ids if (r := store.get_run(i)) is not None}
    finally:
        store.close()


def _importances(study: optuna.Study) -> dict[str, float] | None:
    """Optuna's fANOVA importances; None before 5 completed trials (meaningless with fewer)."""
    import optuna

    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if len(complete) < 5:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = optuna.importance.get_param_importances(study)
    except (ValueError, RuntimeError, ZeroDivisionError):
        return None
    return {k: round(float(v), 4) for k, v in found.items()}


def write_plots(study: optuna.Study, folder: Path) -> list[str]:
    """Optimisation history, intermediate values, parallel coordinates (PNG) in ``folder``."""
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as plots

    if not any(t.state.name in ("COMPLETE", "PRUNED") for t in study.get_trials(deepcopy=False)):
        return []  # nothing to draw yet
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # "no complete trials" is not news here
    for name, draw in (("history", plots.plot_optimization_history),
                       ("intermediate", plots.plot_intermediate_values),
                       ("parallel", plots.plot_parallel_coordinate)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                axes = draw(study)
                figure = getattr(axes, "figure", None) or plt.gcf()
                path = folder / f"{name}.png"
                figure.savefig(path, dpi=90, bbox_inches="tight")
                plt.close(figure)
            made.append(str(path))
        except (ValueError, RuntimeError, TypeError, IndexError):
            plt.close("all")  # too few trials for this plot yet
    optuna.logging.set_verbosity(verbosity)
    return made


def print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False)
    unit = f"{summary.get('unit') or 'epoch'}s"  # epochs or steps: what trials reported at
    table = Table("#", "state", summary.get("objective") or "value", unit, "cost $",
                  "pruned by", "params", title=f"study {summary['study']}")
    for t in summary["trials"]:
        value = "" if t["value"] is None else f"{t['value']:.4g}"
        params = " ".join(f"{k}={_fmt(v)}" for k, v in t["params"].items())
        table.add_row(str(t["number"]), t["state"], value, str(t[unit]),
                      f"{t['cost_usd']:.4f}", t["pruned_by"] or (t["error"] or "")[:40], params)
    console.print(table)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(summary["counts"].items()))
    full = summary.get(f"{unit}_without_pruning")
    versus = f" ({full} if none had been pruned)" if full else ""
    for t in summary["trials"]:
        if t.get("resumed_as") is not None:
            console.print(f"trial {t['number']} lost its machine; trial {t['resumed_as']} "
                          f"resumed its run {t['run_id']} (one run, its cost counted once)",
                          markup=False)
    console.print(f"trials: {counts}; {unit} used {summary[f'{unit}_total']}{versus}; "
                  f"cost ${summary['cost_usd_total']:.4f}", markup=False)
    if summary["best_params"] is not None:
        console.print(f"best: {summary['objective']}={summary['best_value']:.6g} (trial "
                      f"{summary['best_trial']}, run {summary['best_run_id']}) with "
                      f"{summary['best_params']}", markup=False)
    if summary["importances"]:
        text = ", ".join(f"{k} {v:.2f}" for k, v in summary["importances"].items())
        console.print(f"parameter importances (fANOVA): {text}", markup=False)
    for path in summary.get("plots") or []:
        console.print(f"plot: {path}", markup=False)


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
