from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import prudent
from prudent.kernel.events import Component, Event
from prudent.store.database import Store
from prudent.store.recorder import MetricsRecorder
from prudent.testing import StopAtStep, tiny_loader, tiny_model
from prudent.wiring.config import ProjectSettings


class EventLog(Component):
    """Records which events fired, in order."""

    name = "event_log"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_start(self, run: Any) -> None:
        self.seen.append("start")

    def on_attach(self, run: Any, objects: Any) -> None:
        self.seen.append("attach")

    def on_batch_loaded(self, run: Any, batch: Any, wait_s: float) -> None:
        self.seen.append("batch_loaded")

    def on_after_backward(self, run: Any, loss: Any) -> None:
        self.seen.append("after_backward")

    def on_step_end(self, run: Any, metrics: Any) -> None:
        self.seen.append("step_end")

    def on_log(self, run: Any, metrics: Any) -> None:
        self.seen.append("log")

    def on_epoch_end(self, run: Any, epoch: int) -> None:
        self.seen.append(f"epoch_end:{epoch}")

    def on_stop_requested(self, run: Any, reason: Any) -> None:
        self.seen.append(f"stop_requested:{reason}")

    def on_end(self, run: Any, status: str, stop_reason: str | None) -> None:
        self.seen.append(f"end:{status}")


def train(run: prudent.Run, epochs: int = 2, loader: Any = None) -> None:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model=model, optimizer=opt)
    with run:
        for _ in run.epochs(epochs):
            for x, y in run.batches(loader or tiny_loader()):
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
            run.log(val_acc=0.5)


def test_completed_run_records_status_metrics_and_counters(settings: ProjectSettings) -> None:
    run = prudent.init(name="unit", config={"lr": 0.1}, settings=settings, exit_on_stop=False)
    train(run)
    assert (run.status, run.stop_reason, run.state.step, run.state.epoch) == ("completed", None, 16, 2)
    store = Store.open(settings.store)
    record = store.get_run(run.id)
    assert record is not None and record["status"] == "completed" and record["step"] == 16
    assert len(store.metric_series(run.id, "loss")) == 16
    assert store.last_metrics(run.id)["val_acc"] == 0.5
    assert [e["name"] for e in store.events(run.id) if e["kind"] == "lifecycle"] == ["start", "end"]
    store.close()


def test_the_run_names_its_machine_as_prudent_host_says(
        settings: ProjectSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    # a Kubernetes pod is called train-0 on every node: the record must say which node
    monkeypatch.setenv("PRUDENT_HOST", "node-a17")
    run = prudent.init(name="host", settings=settings, exit_on_stop=False)
    train(run, epochs=1)
    store = Store.open(settings.store)
    try:
        record = store.get_run(run.id)
        start = next(e for e in store.events(run.id) if e["name"] == "start")
    finally:
        store.close()
    assert record is not None and record["host"] == "node-a17"
    assert start["message"].endswith("started on node-a17")


def test_events_fire_in_loop_order(settings: ProjectSettings) -> None:
    log = EventLog()
    run = prudent.init(name="order", settings=settings, exit_on_stop=False, components=[log])
    train(run, epochs=1, loader=tiny_loader(num_samples=16, batch_size=8))
    per_batch = ["batch_loaded", "after_backward", "step_end"]
    assert log.seen == ["start", "attach", *per_batch, *per_batch, "log", "epoch_end:0", "end:completed"]


def test_component_is_only_called_for_events_it_overrides(settings: ProjectSettings) -> None:
    run = prudent.init(name="dispatch", settings=settings, exit_on_stop=False, components=[StopAtStep(99, "rule:test")])
    assert run.context.handlers[Event.STEP_END] and not run.context.handlers[Event.LOG]
    run.context.finish("completed")


def test_batch_wrappers_change_what_every_epoch_yields(settings: ProjectSettings) -> None:
    from itertools import islice

    run = prudent.init(name="wrapped", settings=settings, exit_on_stop=False, components=[])
    run.context.wrap_batches(lambda batches: islice(batches, 3))  # a short epoch, as preflight wants
    train(run, epochs=2, loader=tiny_loader(num_samples=64, batch_size=8))
    assert (run.status, run.state.step) == ("completed", 6)


def test_host_scalar_reads_a_cpu_loss_once_for_every_component_that_asks(
        settings: ProjectSettings) -> None:
    run = prudent.init(name="host", settings=settings, exit_on_stop=False, components=[])
    loss = torch.tensor(2.5, requires_grad=True) * 1
    assert run.context.host_scalar(loss) == 2.5 and isinstance(run.context.host_scalar(loss), float)
    with torch.no_grad():
        loss.fill_(7.0)  # the same tensor: the number read at its first ask is reused
    assert run.context.host_scalar(loss) == 2.5
    accuracy = torch.tensor(1.0)
    assert run.context.host_scalar(accuracy) == 1.0  # a new tensor is read...
    assert run.context.host_scalar(loss) == 2.5  # ...and the loss still remembered
    batch = torch.ones(3)
    assert run.context.host_scalar(batch) is batch and run.context.host_scalar(0.5) == 0.5
    remembered = weakref.ref(loss)
    run.step()  # the step ends: what it read is forgotten
    del loss
    gc.collect()
    assert remembered() is None  # remembering its number does not keep a loss (and graph) alive
    run.context.finish("completed")


def test_stop_request_unwinds_to_with_block_without_exiting(settings: ProjectSettings) -> None:
    log = EventLog()
    run = prudent.init(name="stop", settings=settings, exit_on_stop=False,
                       components=[log, StopAtStep(3, "budget")])
    train(run)
    assert (run.status, run.stop_reason, run.state.step) == ("stopped", "budget", 3)
    assert log.seen.count("stop_requested:budget") == 1 and log.seen[-1] == "end:stopped"
    store = Store.open(settings.store)
    record = store.get_run(run.id)
    assert record is not None and record["stop_reason"] == "budget" and record["exit_code"] == 4
    store.close()


@pytest.mark.parametrize(("reason", "code"), [("rule:non_finite", 3), ("budget", 4),
                                              ("pruned", 5), ("policy", 6), ("preempted", 75)])
def test_stop_exits_process_with_documented_code(settings: ProjectSettings, reason: str,
                                                 code: int) -> None:
    run = prudent.init(name="exit", settings=settings, components=[StopAtStep(2, reason)])
    with pytest.raises(SystemExit) as exited:
        train(run)
    assert exited.value.code == code


def test_exception_marks_run_failed_with_trimmed_traceback(settings: ProjectSettings) -> None:
    run = prudent.init(name="boom", settings=settings, exit_on_stop=False)
    with pytest.raises(ZeroDivisionError), run:
        for _ in run.epochs(1):
            run.step(loss=1.0)
            _ = 1 / 0
    assert (run.status, run.stop_reason) == ("failed", "error")
    store = Store.open(settings.store)
    end = store.events(run.id)[-1]
    assert end["message"] == "ZeroDivisionError: division by zero"
    assert "test_run.py" in end["payload"]["traceback"]
    assert f"{os.sep}prudent{os.sep}run.py" not in end["payload"]["traceback"]
    store.close()


def test_a_users_folder_named_prudent_keeps_its_frames_in_the_traceback(tmp_path: Path) -> None:
    from prudent.kernel.context import trimmed_traceback

    script = tmp_path / "prudent" / "train.py"  # `git clone` of prudent: the default folder
    script.parent.mkdir()
    script.write_text("def train():\n    return 1 / 0\n")
    namespace: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    try:
        namespace["train"]()
    except ZeroDivisionError as exc:
        kept = trimmed_traceback(exc)
    assert str(script) in kept and "return 1 / 0" in kept


def test_keyboard_interrupt_is_recorded_as_interrupted(settings: ProjectSettings) -> None:
    run = prudent.init(name="ctrl-c", settings=settings, exit_on_stop=False)
    with pytest.raises(KeyboardInterrupt), run:
        raise KeyboardInterrupt
    assert (run.status, run.stop_reason) == ("stopped", "interrupted")


def run_script(home: Path, code: str) -> tuple[subprocess.CompletedProcess[str], Store]:
    """``code`` run in an interpreter of its own (its signals, its exit), and its store."""
    env = {**os.environ, "PRUDENT_HOME": str(home), "PRUDENT_CONSOLE": "off"}
    env.pop("PRUDENT_RUN_ID", None)
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=120)
    return child, Store.open(ProjectSettings.model_validate({"store": {"home": str(home)}}).store)


def test_ctrl_c_outside_with_run_is_recorded_as_interrupted_not_failed(tmp_path: Path) -> None:
    """A framework's fit (Keras, Hugging Face) lets Ctrl-C out of the script past every hook:
    the run is closed at exit, and its record must say interrupted, as `with run:` does."""
    child, store = run_script(tmp_path, "import prudent\n"
                              "run = prudent.init(name='fit', exit_on_stop=False)\n"
                              "run.step(loss=1.0)\n"
                              "raise KeyboardInterrupt\n")
    assert child.returncode != 0 and "KeyboardInterrupt" in child.stderr
    (row,) = store.list_runs()
    assert (row["status"], row["stop_reason"]) == ("stopped", "interrupted")
    store.close()


def test_a_sigterm_while_the_run_ends_does_not_cut_its_record(tmp_path: Path) -> None:
    """torchrun sends SIGTERM to every rank once one failed: a rank already writing its end
    (the crash it names, its cost) must still write it, and exit with its own code."""
    child, store = run_script(tmp_path, "import os, signal, prudent\n"
                              "from prudent.kernel.events import Component\n"
                              "class TermAtEnd(Component):\n"
                              "    name = 'term_at_end'\n"
                              "    def on_end(self, run, status, stop_reason):\n"
                              "        os.kill(os.getpid(), signal.SIGTERM)\n"
                              "run = prudent.init(name='ending', exit_on_stop=False,\n"
                              "                   components=[TermAtEnd()])\n"
                              "with run:\n"
                              "    run.step(loss=1.0)\n"
                              "print('after the block')\n")
    assert (child.returncode, child.stdout) == (0, "after the block\n"), child.stderr
    (row,) = store.list_runs()
    assert row["status"] == "completed"
    assert [e["message"] for e in store.events(row["id"]) if e["name"] == "end"] == ["completed"]
    store.close()


def test_sigterm_becomes_preempted_stop_at_next_step(settings: ProjectSettings) -> None:
    run = prudent.init(name="sigterm", settings=settings, exit_on_stop=False)
    with run:
        for _ in run.epochs(1):
            run.step(loss=1.0)
            os.kill(os.getpid(), signal.SIGTERM)
            run.step(loss=1.0)
            pytest.fail("the step after SIGTERM must raise StopRun")
    assert (run.stop_reason, run.state.step) == ("preempted", 2)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handler removed at the end


def test_epochs_start_at_restored_epoch(settings: ProjectSettings) -> None:
    run = prudent.init(name="resume", settings=settings, exit_on_stop=False)
    run.state.epoch = 2
    with run:
        assert list(run.epochs(4)) == [2, 3]


def test_step_keeps_no_graph_alive_and_converts_tensors_later(settings: ProjectSettings) -> None:
    recorder = MetricsRecorder(every_steps=1000, every_s=1000)
    run = prudent.init(name="lazy", settings=settings, exit_on_stop=False, components=[recorder])
    weight = torch.ones(3, requires_grad=True)
    with run:
        loss = (weight * 2).sum()
        scale = (weight[:1] * 3)  # one number, but not a 0-d tensor: left to the writer
        run.step(loss=loss, scale=scale, lr=0.1)
        pending = recorder._pending[0][2]
        assert pending["loss"] == 6.0  # a CPU scalar: read at once, for free
        assert isinstance(pending["scale"], torch.Tensor) and not pending["scale"].requires_grad
    assert run.context.latest["loss"] == 6.0 and run.context.latest["scale"] == 3.0  # the writer converted it


def test_log_values_are_floats_and_visible_at_once(settings: ProjectSettings) -> None:
    run = prudent.init(name="log", settings=settings, exit_on_stop=False)
    with run:
        run.log(val_acc=torch.tensor(0.75), epoch_time=3)
        assert run.context.latest["val_acc"] == 0.75 and isinstance(run.context.latest["epoch_time"], float)


def test_backward_scales_loss_with_an_enabled_grad_scaler(settings: ProjectSettings) -> None:
    run = prudent.init(name="amp", settings=settings, exit_on_stop=False)
    weight = torch.ones(1, requires_grad=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    run.attach(weight=weight, scaler=scaler)
    with run:
        run.backward((weight * 3).sum())
    assert weight.grad is not None and weight.grad.item() == 24.0


def test_device_is_cpu_in_smoke_mode(settings: ProjectSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_SMOKE", "1")
    run = prudent.init(name="smoke", settings=settings, exit_on_stop=False)
    with run:
        assert run.is_smoke and run.device == torch.device("cpu")


def test_set_overrides_reach_config_and_unknown_key_stops_before_start(
        settings: ProjectSettings, monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    monkeypatch.setenv("PRUDENT_SET", '{"lr": "1e-3"}')
    run = prudent.init(name="cfg", config={"lr": 0.1, "epochs": 2}, settings=settings,
                       exit_on_stop=False)
    run.context.finish("completed")
    assert run.config == {"lr": 0.001, "epochs": 2}
    monkeypatch.setenv("PRUDENT_SET", '{"lrr": 0.5}')
    with pytest.raises(SystemExit) as exited:
        prudent.init(name="typo", config={"lr": 0.1}, settings=settings)
    assert exited.value.code == 2
    with pytest.raises(prudent.ConfigError, match="known keys: lr"):
        prudent.init(name="typo", config={"lr": 0.1}, settings=settings, exit_on_stop=False)
