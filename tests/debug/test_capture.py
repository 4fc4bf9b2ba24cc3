from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import prudent
from prudent.debug.bundle import read_bundle
from prudent.debug.capture import FailureCapture
from prudent.debug.mode import DebugMode, capture_on_every_rule
from prudent.debug.probe import ForwardProbe, SampleIndexRecorder, non_finite_rows
from prudent.debug.replay import _restore
from prudent.debug.settings import DebugSettings
from prudent.testing import tiny_loader, tiny_model
from prudent.wiring.config import ProjectSettings, load_settings


def _run(settings: ProjectSettings, *components: object) -> prudent.Run:
    return prudent.init(name="capture", settings=settings, exit_on_stop=False,
                        components=list(components) or [FailureCapture(settings.debug)])


def _bundles(run: prudent.Run) -> list[Path]:
    return sorted((run.context.run_dir / "captures").glob("step-*"))


def test_non_finite_gradient_is_captured_with_the_weights_before_the_update(
        settings: ProjectSettings) -> None:
    run = _run(settings, FailureCapture(DebugSettings(check_gradients=True)))
    model = torch.nn.Linear(4, 1)
    with torch.no_grad():
        model.bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach(model=model, optimizer=opt)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with run:
        for x in run.batches([torch.zeros(2, 4)]):
            loss = model(x).abs().sqrt().mean()  # sqrt(0): the loss is 0, its gradient is inf
            run.backward(loss)
            opt.step()
            run.step(loss=loss)
    (path,) = _bundles(run)
    bundle = read_bundle(path)
    assert path.name == "step-1" and bundle.info["state_when"] == "before_update"
    assert bundle.info["message"].startswith("gradients are not finite in weight, bias (loss 0.0)")
    saved = bundle.load("object-model.pt")
    assert all(torch.equal(saved[k], before[k]) for k in before)
    assert not torch.isfinite(model.weight).all()  # the live weights were ruined by the step


def test_gradients_are_only_checked_when_asked(settings: ProjectSettings) -> None:
    run = _run(settings)  # default: the loss only (a gradient norm per step costs as much again)
    model = torch.nn.Linear(4, 1)
    with torch.no_grad():
        model.bias.zero_()
    run.attach(model=model)
    with run:
        for x in run.batches([torch.zeros(2, 4)]):
            run.backward(model(x).abs().sqrt().mean())
            run.step()
    assert not _bundles(run)


def test_exception_in_a_step_is_captured_with_stack_batch_and_sample_indices(
        settings: ProjectSettings) -> None:
    run = _run(settings)
    model = tiny_model()
    run.attach(model=model)
    loader = DataLoader(TensorDataset(torch.arange(40.0).reshape(20, 2)), batch_size=4,
                        shuffle=True, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="bad row"), run:
        for epoch in run.epochs(2):
            for (x,) in run.batches(loader):
                if run.state.step == 6:
                    raise ValueError("bad row")
                run.step(loss=0.0)
    (path,) = _bundles(run)
    info = read_bundle(path).info
    assert path.name == "step-7" and info["phase"] == "forward" and info["epoch"] == 1
    assert info["error"] == "ValueError: bad row" and "test_capture.py" in info["traceback"]
    (x,) = read_bundle(path).load("batch.pt")
    assert (x[:, 0] / 2).long().tolist() == info["sample_indices"]  # row i of the data is 2i, 2i+1
    assert info["versions"]["torch"] == torch.__version__ and info["config"] == {}


@pytest.mark.parametrize(("workers", "fail_at"), [(0, 100), (2, 37)])
def test_the_bundle_names_its_batch_samples_late_in_an_epoch_and_with_workers(
        settings: ProjectSettings, workers: int, fail_at: int) -> None:
    """Nothing is done per batch for the indices: the sampler's outputs are kept (the newest
    64, more when workers draw ahead) and the bundle looks its batch up by its number."""
    run = _run(settings)
    run.attach(model=tiny_model())
    loader = DataLoader(TensorDataset(torch.arange(600.0).reshape(300, 2)), batch_size=2,
                        shuffle=True, generator=torch.Generator().manual_seed(1),
                        num_workers=workers)
    with pytest.raises(ValueError, match="bad batch"), run:
        for (x,) in run.batches(loader):
            if run.state.step + 1 == fail_at:
                raise ValueError("bad batch")
            run.step(loss=0.0)
    (path,) = _bundles(run)
    info = read_bundle(path).info
    (x,) = read_bundle(path).load("batch.pt")
    assert info["batch_in_epoch"] == fail_at
    assert (x[:, 0] / 2).long().tolist() == info["sample_indices"]


def test_one_bundle_per_failure_not_one_per_step_after_it(settings: ProjectSettings) -> None:
    run = _run(settings)
    model = tiny_model()
    run.attach(model=model)
    with run:
        for x, _ in run.batches(tiny_loader()):
            loss = model(x).sum() * (float("nan") if run.state.step >= 2 else 1.0)
            run.backward(loss)
            run.step(loss=loss)
            if run.state.step >= 3:
                run.capture("rule:non_finite", "the rule saw it too")  # the same failure again
    assert [p.name for p in _bundles(run)] == ["step-3"]


def test_capture_requested_from_another_thread_is_written_at_the_next_step(
        settings: ProjectSettings) -> None:
    run = _run(settings)
    model = tiny_model()
    run.attach(model=model)
    with run:
        for x, _ in run.batches(tiny_loader()):
            if run.state.step == 2:
                thread = threading.Thread(target=run.capture, args=("rule:stalled", "stuck"))
                thread.start()
                thread.join()
                assert not _bundles(run)
            run.step(loss=0.0)
    (path,) = _bundles(run)
    assert path.name == "step-3" and read_bundle(path).info["state_when"] == "after_update"


def test_non_finite_rows_and_forward_probe_find_the_bad_sample() -> None:
    batch = (torch.ones(4, 3), torch.zeros(4))
    batch[0][2, 1] = float("inf")
    assert non_finite_rows(batch) == {2: ["batch[0]"]}
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    torch.nn.init.ones_(model[0].weight)
    x = torch.ones(4, 3)
    x[1] = 3e38  # finite, but the first layer's sum overflows on it
    probe = ForwardProbe({"model": model}, 4)
    model(x)
    probe.remove()
    assert probe.first is not None and probe.first["module"] == "0" and probe.first["rows"] == [1]


def test_sample_index_recorder_follows_a_shuffled_loader() -> None:
    loader = DataLoader(TensorDataset(torch.arange(10)), batch_size=3, shuffle=True)
    iterator = iter(loader)
    recorder = SampleIndexRecorder.install(iterator)
    assert recorder is not None
    for (values,) in iterator:
        assert recorder.next_batch() == values.tolist()


def test_restore_names_missing_and_unexpected_keys() -> None:
    saved = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)).state_dict()
    other = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    problem = _restore(other, saved)
    assert problem is not None
    assert "missing keys (in the model, not in the bundle): 2.weight, 2.bias" in problem
    assert "unexpected keys (in the bundle, not in the model): 1.weight, 1.bias" in problem


def test_debug_mode_logs_every_event_and_restores_torch_switches(settings: ProjectSettings) -> None:
    stream = io.StringIO()
    run = _run(settings, DebugMode(stream))
    assert torch.is_anomaly_enabled()
    model = tiny_model()
    run.attach(model=model)
    with run:
        for x, _ in run.batches(tiny_loader(num_samples=8)):
            loss = model(x).sum()
            run.backward(loss)
            run.step(loss=loss)
    assert not torch.is_anomaly_enabled() and not torch.are_deterministic_algorithms_enabled()
    text = stream.getvalue()
    for event in ("start", "attach: model=Sequential",
                  "batch_loaded: epoch 1 batch 1: batch[0]: float32[8, 8] cpu",
                  "after_backward: loss", "step_end: loss=", "end: completed"):
        assert event in text


def test_debug_mode_adds_capture_to_every_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_DEBUG", "1")
    settings = load_settings()
    assert settings.debug.enabled
    rules = capture_on_every_rule(settings.monitor, True).rule_settings()
    assert all("capture" in rule.action for rule in rules.values())
    assert rules["non_finite"].action == ["stop", "capture"]


def test_a_loop_without_run_backward_is_captured_at_run_step_and_says_after_update(
        settings: ProjectSettings) -> None:
    run = _run(settings)
    model = tiny_model()
    run.attach(model=model)
    with run:
        for x, _ in run.batches(tiny_loader()):
            loss = model(x).sum() * (float("inf") if run.state.step == 1 else 1.0)
            loss.backward()
            run.step(loss=loss)
    (path,) = _bundles(run)
    info = read_bundle(path).info
    assert path.name == "step-2" and info["state_when"] == "after_update"
    assert "the loop does not call run.backward" in info["message"]


@pytest.mark.parametrize("dropout", [0.5, 0.0])
def test_a_late_failure_keeps_the_generators_as_its_step_started(settings: ProjectSettings,
                                                                 dropout: float) -> None:
    """Whether or not the steps draw random numbers (dropout), the bundle of a failure long
    after the first batches holds the generator state its step started from: replay is exact
    although the state is not copied on every batch."""
    run = _run(settings)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(dropout),
                                torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run.attach(model=model, optimizer=opt)
    fail_at, started = 300, None
    with run:
        for x in run.batches([torch.randn(2, 4) for _ in range(fail_at)]):
            if run.state.step + 1 == fail_at:
                started = torch.get_rng_state()
            loss = model(x).pow(2).mean() * (float("nan") if run.state.step + 1 == fail_at else 1)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
    (path,) = _bundles(run)
    saved = read_bundle(path).load("run.pt")["rng"]["torch"]
    assert path.name == f"step-{fail_at}" and torch.equal(saved, started)


def _steps_with_nan_at(run: prudent.Run, nan_at: int, steps: int, fail_at: int = 0) -> None:
    weight = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([weight], lr=0.1)
    run.attach(model=torch.nn.Module(), optimizer=opt)
    with run:
        for it in run.steps(steps):
            loss = (weight * (float("nan") if it + 1 == nan_at else 1.0)).sum()
            run.backward(loss)
            if it + 1 == fail_at:
                raise RuntimeError("broken after backward")
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)


def test_a_finite_loss_costs_capture_no_call_and_a_nan_is_still_caught_before_the_update(
        settings: ProjectSettings) -> None:
    capture = FailureCapture(settings.debug)
    run = _run(settings, capture)
    calls: list[int] = []

    def counted(handler: object) -> object:
        def call(ctx: object, loss: object) -> None:
            calls.append(run.state.step + 1)
            handler(ctx, loss)  # type: ignore[operator]
        return call if getattr(handler, "__self__", None) is capture else handler

    run.context.wrap_handlers(counted,  # type: ignore[arg-type]
                              [prudent.kernel.events.Event.AFTER_BACKWARD])
    _steps_with_nan_at(run, nan_at=15, steps=20)
    # the kernel's loss watch compared steps 1-14 alone; from 15 on the weights are NaN
    assert calls == list(range(15, 21))
    (path,) = _bundles(run)
    info = read_bundle(path).info
    assert path.name == "step-15" and info["state_when"] == "before_update"
    assert info["phase"] == "after_backward" and info["loss"] == "nan"


def test_an_error_after_backward_in_an_iteration_loop_is_bundled_before_the_update(
        settings: ProjectSettings) -> None:
    run = _run(settings)
    with pytest.raises(RuntimeError, match="broken after backward"):
        _steps_with_nan_at(run, nan_at=0, steps=10, fail_at=6)
    (path,) = _bundles(run)
    info = read_bundle(path).info
    assert path.name == "step-6" and info["phase"] == "after_backward"
    assert info["state_when"] == "before_update"
    assert info["loss"] == pytest.approx(1.5, rel=1e-5)  # 3 x (1 - 5 x 0.1): the step's own


def test_a_bundles_traceback_keeps_the_frames_of_a_project_folder_named_prudent(
        tmp_path: Path) -> None:
    # any path with "/prudent/" in it was taken for prudent's own code: a clone into a folder
    # named prudent (git's default) left the bundle with the error's message and no frame
    from prudent.debug.environment import user_traceback

    script = tmp_path / "prudent" / "train.py"
    script.parent.mkdir()
    script.write_text("def train():\n    raise ValueError('bad row')\n")
    namespace: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    try:
        namespace["train"]()
    except ValueError as exc:
        kept = user_traceback(exc)
    assert kept is not None and str(script) in kept and "raise ValueError" in kept
