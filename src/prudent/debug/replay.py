"""Replay components: what runs inside the user's unchanged script under ``prudent replay``.

``BundleReplay`` (a bundle in the launch spec): restores the captured objects when they are
attached (a model with other keys is refused, naming them), feeds the captured batch as the only
batch of the loop with the RNG as it was, lets the step run, reports what it saw (loss, bits,
non-finite gradients, the first layer whose output was not finite, the offending samples) to
``<run folder>/replay.json`` and stops the script.

``StepReplay`` (a step S in the launch spec): the run was resumed from a checkpoint before step S
(prepared by the command); it trains on to step S, reports it the same way and stops.

``prudent replay --pdb``: stop in the debugger at the failure: after ``run.backward`` of the
step in the user's own frame, or post mortem on the exception the step raised.
"""

from __future__ import annotations

import json
import math
import os
import pdb
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from prudent.checkpoint.objects import restore_object
from prudent.debug.bundle import BATCH_FILE, RUN_FILE, Bundle, object_file, read_bundle
from prudent.debug.probe import (
    ForwardProbe,
    IndexedBatches,
    batch_size_of,
    non_finite_grads,
    non_finite_rows,
)
from prudent.kernel.errors import ConfigError
from prudent.kernel.events import Component
from prudent.kernel.rng import restore_rng
from prudent.kernel.stop import StopKind, StopReason
from prudent.launch.spec import ENV_REPLAY, ENV_REPLAY_PDB, ENV_REPLAY_STEP, LaunchSpec

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext
    from prudent.kernel.stop import StopReason

__all__ = ["ENV_REPLAY", "ENV_REPLAY_PDB", "ENV_REPLAY_STEP", "REPORT_FILE", "BundleReplay",
           "StepReplay", "replay_from_env"]

REPORT_FILE = "replay.json"


def replay_from_env() -> Component | None:
    """The replay component this process was launched for, if any."""
    replay = LaunchSpec.from_env().replay
    if replay is not None and replay.bundle:
        return BundleReplay(replay.bundle, replay.pdb)
    if replay is not None and replay.step is not None:
        return StepReplay(replay.step, replay.pdb)
    return None


class _Replay(Component):
    """Watches one step (``target``): probes its forward pass, reports it, stops the run."""

    name = "replay"
    target = 0

    def __init__(self, use_pdb: bool = False) -> None:
        self.use_pdb = use_pdb
        self.report: dict[str, Any] | None = None
        self._modules: dict[str, torch.nn.Module] = {}
        self._params: list[tuple[str, torch.Tensor]] = []
        self._probe: ForwardProbe | None = None
        self._batch: Any = None
        self._indices: list[Any] | None = None

    def on_attach(self, run: RunContext, objects: dict[str, Any]) -> None:
        modules = {k: o for k, o in objects.items() if isinstance(o, torch.nn.Module)}
        self._modules.update(modules)
        for key, module in modules.items():
            self._params += [(n if len(modules) == 1 else f"{key}.{n}", p)
                             for n, p in module.named_parameters() if p.requires_grad]

    def on_batch_loaded(self, run: RunContext, batch: Any, wait_s: float) -> None:
        if run.state.step + 1 == self.target:
            self._batch = batch
            self._probe = ForwardProbe(self._modules, batch_size_of(batch))

    def on_after_backward(self, run: RunContext, loss: Any) -> None:
        if run.state.step + 1 != self.target or self.report is not None:
            return
        self.report = self._observe(run, loss, None)
        self._print(run)
        if self.use_pdb and self.report["non_finite"]:
            _break_in_user_code(f"prudent replay: step {self.target}: {self.report['summary']}; "
                                "you are after run.backward(loss) in your loop")
        run.request_stop(StopReason(StopKind.REPLAY, None, f"replayed step {self.target}"))

    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        if run.state.step >= self.target and self.report is None:
            if run.state.step == self.target:  # a loop without run.backward: judge run.step's loss
                self.report = self._observe(run, metrics.get("loss"), None, note=(
                    "the script calls loss.backward() itself, not run.backward(loss): the loss "
                    "is the one given to run.step."))
            else:  # resumed from a checkpoint after the target
                late = f"the run resumed at step {run.state.step}, after step {self.target}"
                self.report = self._base(run) | {"reached": False, "summary": late}
            self._print(run)
            run.request_stop(StopReason(StopKind.REPLAY, None, f"replayed step {self.target}"))

    def on_capture_requested(self, run: RunContext, reason: str, message: str,
                             error: BaseException | None) -> None:
        if error is None or isinstance(error, SystemExit) or self.report is not None:
            return
        self.report = self._observe(run, None, error)
        self._print(run)
        if self.use_pdb:
            print(f"prudent replay: post mortem of {type(error).__name__}: {error}", flush=True)
            pdb.post_mortem(error.__traceback__)

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        if self._probe is not None:
            self._probe.remove()
        if self.report is None:
            self.report = self._base(run) | {
                "reached": False, "summary": f"the script ended ({status}) before step "
                f"{self.target} ran: is it the script that was captured?"}
        (run.run_dir / REPORT_FILE).write_text(json.dumps(self.report, indent=1, default=str))

    # observing ----------------------------------------------------------------------------
    def _observe(self, run: RunContext, loss: Any, error: BaseException | None,
                 note: str | None = None) -> dict[str, Any]:
        if self._probe is not None:
            self._probe.remove()
        first = self._probe.first if self._probe is not None else None
        rows = non_finite_rows(self._batch) if self._batch is not None else {}
        report = self._base(run) | {
            "reached": True, "error": f"{type(error).__name__}: {error}" if error else None,
            "first_non_finite": first, "offending": self._offending(rows, first)}
        if note:
            report["note"] = note
        if loss is not None:
            value = loss.detach() if isinstance(loss, torch.Tensor) else torch.tensor(loss)
            report |= {"loss": _number(value), "loss_bits": _bits(value),
                       "non_finite": not bool(torch.isfinite(value).all())}
            report["non_finite_grads"] = non_finite_grads(self._params)
            report["non_finite"] = report["non_finite"] or bool(report["non_finite_grads"])
        report |= self._compare(report)
        return report

    def _offending(self, rows: dict[int, list[str]],
                   first: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Rows with NaN/inf in the batch itself, else the rows of the first non-finite layer."""
        found = {row: f"NaN/inf in {', '.join(where)}" for row, where in rows.items()}
        size = batch_size_of(self._batch) or 0
        if not found and first is not None and len(first["rows"]) < size:  # some rows, not all
            layer = f"first non-finite output of {first['module']} ({first['type']})"
            found = dict.fromkeys(first["rows"], layer)
        indices = self._indices
        return [{"row": row, "sample_index": indices[row] if indices and row < len(indices)
                 else None, "why": why} for row, why in sorted(found.items())]

    def _base(self, run: RunContext) -> dict[str, Any]:
        return {"step": self.target, "epoch": run.state.epoch, "run_id": run.id,
                "device": _devices(self._modules)}

    def _compare(self, report: dict[str, Any]) -> dict[str, Any]:
        return {"summary": _summary(report)}

    def _print(self, run: RunContext) -> None:
        assert self.report is not None
        print(f"prudent replay | step {self.target} | {self.report['summary']}", file=sys.stderr,
              flush=True)


class BundleReplay(_Replay):
    def __init__(self, path: str, use_pdb: bool = False) -> None:
        super().__init__(use_pdb)
        self.path = path
        self.bundle: Bundle | None = None
        self._saved: dict[str, Any] = {}
        self._restored: set[str] = set()
        self._run_state: dict[str, Any] = {}
        self._run: Any = None
        self._fed = False

    def on_start(self, run: RunContext) -> None:
        self._run = run
        try:
            self.bundle = read_bundle(self.path)
            for needed in (BATCH_FILE, RUN_FILE):
                if not self.bundle.has(needed):
                    raise ConfigError(f"capture bundle {self.path} has no {needed} (left out: "
                                      "over max_bytes): raise debug.max_bytes, or replay from a "
                                      "checkpoint with prudent replay RUN --step S")
            self._run_state = self.bundle.load(RUN_FILE)
            self._batch = self.bundle.load(BATCH_FILE)
        except ConfigError as exc:
            _refuse(run, str(exc))
        info = self.bundle.info
        if info.get("local_shards"):
            _refuse(run, f"capture bundle {self.path} holds the shards of rank "
                    f"{info.get('rank')} only (the model was sharded: FSDP2's DTensors), not "
                    "the whole model a replay needs: replay the step from a checkpoint with "
                    "prudent replay RUN --step S")
        self.target = int(info["step"])
        self._indices = info.get("sample_indices")
        run.state.step, run.state.epoch = self.target - 1, int(info.get("epoch", 0))
        run.wrap_batches(self._feed)

    def on_attach(self, run: RunContext, objects: dict[str, Any]) -> None:
        super().on_attach(run, objects)
        assert self.bundle is not None
        captured = set(self.bundle.info.get("objects", []))
        unknown = sorted(set(objects) - captured)
        if unknown:
            _refuse(run, f"the script attaches {', '.join(unknown)} but the bundle holds "
                    f"{', '.join(sorted(captured)) or 'no objects'}: is it the script that was "
                    "captured?")
        for key, obj in objects.items():
            if not self.bundle.has(object_file(key)):
                self._left_out(run, key, obj)
                continue
            problem = _restore(obj, self.bundle.load(object_file(key)))
            if problem:
                _refuse(run, f"cannot restore {key!r} from capture bundle {self.path}: {problem}")
            self._restored.add(key)

    def _left_out(self, run: RunContext, key: str, obj: Any) -> None:
        if isinstance(obj, torch.nn.Module):
            _refuse(run, f"capture bundle {self.path} does not hold {key!r} (left out: over "
                    "max_bytes), so the step cannot be replayed: raise debug.max_bytes, or "
                    "replay from a checkpoint with prudent replay RUN --step S")
        print(f"prudent replay: warning: {key!r} is not in the bundle (over max_bytes); it keeps "
              "the script's own state (the replayed loss does not depend on it)", file=sys.stderr)
        self._restored.add(key)

    def _feed(self, iterator: Any) -> Any:
        """The loop's only batch: the captured one, with the RNG as it was when it arrived."""
        assert self.bundle is not None
        missing = sorted(set(self.bundle.info.get("objects", [])) - self._restored)
        if missing:
            _refuse(self._run, f"the bundle holds {', '.join(missing)} but the script did not "
                              "attach it before training: run.attach(...) it as the captured "
                              "script did")
        if self._fed:
            return  # one step only, even if the loop asks for another epoch
        self._fed = True
        if self._run_state.get("rng"):
            restore_rng(self._run_state["rng"])
        yield self._batch  # on the CPU, as the loader gave it: the loop moves it as usual

    def _compare(self, report: dict[str, Any]) -> dict[str, Any]:
        assert self.bundle is not None
        info = self.bundle.info
        captured = self._run_state.get("loss")
        out: dict[str, Any] = {"bundle": str(self.bundle.path), "captured_reason": info["reason"],
                               "captured_message": info.get("message"),
                               "captured_error": info.get("error"),
                               "captured_loss": info.get("loss"),
                               "captured_device": info.get("device"),
                               "state_when": info.get("state_when")}
        if isinstance(captured, torch.Tensor) and "loss_bits" in report:
            out["captured_loss_bits"] = _bits(captured)
            out["bit_identical"] = out["captured_loss_bits"] == report["loss_bits"]
        out["reproduced"] = _reproduced(report, out)
        notes = [report["note"]] if report.get("note") else []
        captured_on, replayed_on = info.get("model_devices") or [], report.get("device") or []
        if captured_on and [d.split(":")[0] for d in captured_on] != [
                d.split(":")[0] for d in replayed_on]:
            notes.append(f"captured on {', '.join(captured_on)}, replayed on "
                         f"{', '.join(replayed_on)}: expect close values, not identical bits.")
        if info.get("state_when") == "after_update":
            out["reproduced"] = False  # whatever the numbers say: it is not the same step
            notes.append(f"The bundle holds the state after step {self.target}'s update (captured "
                         "at a rule's check, at run.step or outside a step): this ran that step's "
                         "batch on those weights, which is not a reproduction of the step.")
        if notes:
            out["note"] = " ".join(notes)
        report |= out
        out["summary"] = _summary(report)
        return out


class StepReplay(_Replay):
    """Train on from the resumed checkpoint to step ``target``, then report it."""

    def __init__(self, target: int, use_pdb: bool = False) -> None:
        super().__init__(use_pdb)
        self.target = target
        self._epoch_batches: IndexedBatches | None = None

    def on_start(self, run: RunContext) -> None:
        run.wrap_batches(self._record_indices)

    def _record_indices(self, iterator: Any) -> Any:
        self._epoch_batches = IndexedBatches(iterator)
        return self._epoch_batches

    def on_batch_loaded(self, run: RunContext, batch: Any, wait_s: float) -> None:
        if self._epoch_batches is not None:
            self._indices = self._epoch_batches.indices
        super().on_batch_loaded(run, batch, wait_s)



def _reproduced(report: dict[str, Any], captured: dict[str, Any]) -> bool:
    if captured.get("captured_error"):
        return report.get("error") == captured["captured_error"]
    if report.get("error"):
        return False
    if captured.get("bit_identical"):
        return True
    loss, was = report.get("loss"), captured.get("captured_loss")
    return isinstance(loss, str) and loss == was  # the same kind of non-finite value


def _summary(report: dict[str, Any]) -> str:
    if report.get("error"):
        text = f"raised {report['error']}"
    else:
        text = f"loss {report.get('loss')}" + (" (not finite)" if report.get("non_finite") else "")
        if report.get("non_finite_grads"):
            text += f"; non-finite gradients in {', '.join(report['non_finite_grads'][:3])}"
    if "captured_loss" in report and not report.get("captured_error"):
        same = " bit-identical" if report.get("bit_identical") else ""
        text += f"; captured loss {report['captured_loss']}{same}"
    samples = [o["sample_index"] for o in report.get("offending", [])]
    if samples and None not in samples:
        text += f"; offending sample index {', '.join(map(str, samples))}"
    elif report.get("offending"):
        text += f"; offending batch row {', '.join(str(o['row']) for o in report['offending'])}"
    if "reproduced" in report:
        text += "; REPRODUCED" if report["reproduced"] else "; NOT reproduced"
    return text


def _restore(obj: Any, saved: Any) -> str | None:
    """Load ``saved`` into ``obj``; the reason it does not fit, or None."""
    if isinstance(obj, torch.nn.Module):
        problem = _key_mismatch(obj.state_dict(), saved)
        if problem:
            return problem
    try:
        restore_object(obj, saved)
    except Exception as exc:  # noqa: BLE001 - any mismatch is reported the same way
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    return None


def _key_mismatch(expected: dict[str, Any], saved: dict[str, Any]) -> str | None:
    missing = [k for k in expected if k not in saved]
    unexpected = [k for k in saved if k not in expected]
    shapes = [f"{k} (bundle {list(saved[k].shape)}, model {list(v.shape)})"
              for k, v in expected.items() if k in saved and isinstance(v, torch.Tensor)
              and isinstance(saved[k], torch.Tensor) and saved[k].shape != v.shape]
    parts = []
    if missing:
        parts.append(f"missing keys (in the model, not in the bundle): {', '.join(missing)}")
    if unexpected:
        parts.append(f"unexpected keys (in the bundle, not in the model): {', '.join(unexpected)}")
    if shapes:
        parts.append(f"different shapes: {', '.join(shapes)}")
    if not parts:
        return None
    return "; ".join(parts) + ". The bundle was captured from a different model: replay it with " \
        "the script (and the code version) that wrote it"


def _devices(modules: dict[str, torch.nn.Module]) -> list[str]:
    return sorted({str(p.device) for m in modules.values() for p in m.parameters()})


def _number(value: torch.Tensor) -> float | str:
    number = float(value.float().mean())
    return number if math.isfinite(number) else str(number)


def _bits(value: torch.Tensor) -> str:
    """The loss's exact bytes, as hex: equal bits, not just equal printed digits."""
    flat = value.detach().cpu().contiguous().reshape(-1)
    raw = bytes(flat.view(torch.uint8).tolist())
    return f"{str(flat.dtype).removeprefix('torch.')}:{raw.hex()}"


def _break_in_user_code(message: str) -> None:
    """Stop in the debugger at the next line of the user's loop (the frame that called us)."""
    frame = sys._getframe(1)
    while frame is not None and f"{os.sep}prudent{os.sep}" in frame.f_code.co_filename:
        frame = frame.f_back  # type: ignore[assignment]
    print(message, flush=True)
    debugger = pdb.Pdb(skip=["prudent", "prudent.*", "bdb", "pdb", "torch", "torch.*"])
    debugger.set_trace(frame)
    debugger.set_until(frame)


def _refuse(run: RunContext, message: str) -> NoReturn:
    """Bad input: one line naming the fix, the run recorded as failed, exit code 2."""
    if not run.exit_on_stop:
        raise ConfigError(message)
    print(f"prudent: error: {message}", file=sys.stderr, flush=True)
    run.finish("failed", StopReason(StopKind.ERROR, None, message), message)
    raise SystemExit(2)
