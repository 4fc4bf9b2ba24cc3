"""TraceWindow: ``torch.profiler`` over a few chosen steps (``--profile-steps 100:110``).

The continuous profile says where time goes by category; a trace says which operators take
it. Tracing is heavy (10-50% slower steps, traces of megabytes per step), so it runs only on
request and only for a window. It writes, into the run's folder, a Chrome trace that opens
in Perfetto (ui.perfetto.dev) or ``chrome://tracing``, named as TensorBoard's profiler
plugin expects, and a plain-text table of the top operators.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prudent.profile.settings import StepWindow

__all__ = ["TraceWindow"]

NUM_TOP_OPS = 10


class TraceWindow:
    """Begin, mark steps, end; :meth:`end` returns what was written."""

    def __init__(self, window: StepWindow) -> None:
        self.window = window
        self.state = "waiting"  # -> tracing -> written, or skipped
        self._profiler: Any = None
        self._on_cuda = False
        self._first_step = window.start

    def begin(self, on_cuda: bool, step: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
        self._on_cuda, self._first_step = on_cuda, step
        # a schedule that always records: only then does torch mark ProfilerStep#N ranges
        self._profiler = profile(activities=activities, record_shapes=False, with_stack=False,
                                 schedule=_always_record)
        self._profiler.step_num = step + 1  # the trace's step numbers are the run's
        self._profiler.start()
        self.state = "tracing"

    def step(self) -> None:
        """Mark a step boundary, so the trace shows ``ProfilerStep#N`` ranges."""
        self._profiler.step()

    def end(self, folder: Path, last_step: int) -> dict[str, Any]:
        """Stop, write the trace and the operator table, and describe them."""
        self._profiler.stop()
        name = f"steps-{self._first_step}-{last_step}"
        trace, table = folder / f"trace-{name}.pt.trace.json", folder / f"ops-{name}.txt"
        self._profiler.export_chrome_trace(str(trace))
        averages = self._profiler.key_averages()
        sort_by = "self_device_time_total" if self._on_cuda else "self_cpu_time_total"
        table.write_text(averages.table(sort_by=sort_by, row_limit=25) + "\n")
        self._profiler, self.state = None, "written"
        return {"steps": f"{self._first_step}:{last_step}", "trace": str(trace),
                "ops_table": str(table), "top_ops": _top_ops(averages, self._on_cuda)}


def _always_record(step: int) -> Any:
    from torch.profiler import ProfilerAction

    return ProfilerAction.RECORD


def _top_ops(averages: Any, on_cuda: bool) -> list[dict[str, Any]]:
    def self_time(event: Any) -> float:
        return float(event.self_device_time_total if on_cuda else event.self_cpu_time_total)

    ops = [e for e in averages if not e.key.startswith("ProfilerStep")]  # steps, not operators
    ranked = sorted(ops, key=self_time, reverse=True)[:NUM_TOP_OPS]
    return [{"name": e.key, "self_ms": round(self_time(e) / 1000, 3), "calls": int(e.count)}
            for e in ranked]
