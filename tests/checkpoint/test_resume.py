"""In-process exact resume: stop a run mid-epoch, start it again, compare with no stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import prudent
from prudent.store.database import Store
from prudent.testing import StopAtStep, make_settings
from prudent.wiring.config import ProjectSettings


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        g = torch.Generator().manual_seed(1)
        for _ in range(12):
            x = torch.randn(4, 8, generator=g)
            yield x, (x[:, 0] > 0).long()


def make_loader(kind: str) -> Any:
    torch.manual_seed(123)
    x = torch.randn(96, 8)
    y = (x[:, 0] > 0).long()
    if kind == "stream":
        return DataLoader(Stream(), batch_size=None)
    generator = torch.Generator().manual_seed(5) if kind == "generator" else None
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, generator=generator)


def train(settings: ProjectSettings, kind: str, stop_at: int | None = None,
          crash_at: int | None = None) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    extra = [StopAtStep(stop_at)] if stop_at else []
    run = prudent.init(name="r", settings=settings, exit_on_stop=False)
    for component in extra:
        run.context.add_component(component)
    run.attach(model=model, optimizer=opt, scheduler=sched, counters={"seen": 0})
    loader = make_loader(kind)
    with run:
        for _ in run.epochs(3):
            for x, y in run.batches(loader):
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                sched.step()
                run.context.objects["counters"]["seen"] += len(x)
                run.step(loss=loss)
                if run.state.step == crash_at:
                    raise RuntimeError("the machine goes away")
    return {"status": run.status, "step": run.state.step, "model": model.state_dict(),
            "opt": opt.state_dict(), "seen": run.context.objects["counters"]["seen"], "id": run.id}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


@pytest.mark.parametrize("kind", ["global_rng", "generator"])
@pytest.mark.parametrize("stop_at", [5, 12, 13, 30])  # mid-epoch, end of epoch 1, first of 2, ...
def test_stop_and_resume_is_bit_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      kind: str, stop_at: int) -> None:
    monkeypatch.setenv("PRUDENT_RUN_ID", "reference")
    reference = train(make_settings(tmp_path), kind)
    monkeypatch.setenv("PRUDENT_RUN_ID", "victim")
    first = train(make_settings(tmp_path), kind, stop_at=stop_at)
    assert (first["status"], first["step"]) == ("stopped", stop_at)
    resumed = train(make_settings(tmp_path), kind)
    assert resumed["status"] == "completed" and resumed["step"] == reference["step"] == 36
    assert same(reference["model"], resumed["model"]) and same(reference["opt"], resumed["opt"])
    assert resumed["seen"] == reference["seen"] == 288  # each sample seen exactly 3 times


@pytest.mark.parametrize("kind", ["global_rng", "generator"])
def test_a_crash_after_an_epoch_end_checkpoint_resumes_exactly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Only epoch-end checkpoints, the process gone mid-epoch 2: the new process resumes from
    the checkpoint between epochs 1 and 2, and epoch 2 must be shuffled as it was (the
    loader's own generator as it was at the checkpoint, not as the script seeds it again)."""
    every_epoch = {"checkpoint": {"every": "1epoch"}}
    monkeypatch.setenv("PRUDENT_RUN_ID", "reference")
    reference = train(make_settings(tmp_path, **every_epoch), kind)
    monkeypatch.setenv("PRUDENT_RUN_ID", "victim")
    with pytest.raises(RuntimeError, match="goes away"):
        train(make_settings(tmp_path, **every_epoch), kind, crash_at=17)
    resumed = train(make_settings(tmp_path, **every_epoch), kind)
    assert resumed["status"] == "completed" and resumed["step"] == reference["step"] == 36
    assert same(reference["model"], resumed["model"]) and same(reference["opt"], resumed["opt"])


def test_unskippable_loader_is_read_and_discarded_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_RUN_ID", "reference")
    reference = train(make_settings(tmp_path), "stream")
    monkeypatch.setenv("PRUDENT_RUN_ID", "victim")
    train(make_settings(tmp_path), "stream", stop_at=5)
    with pytest.warns(UserWarning, match="by reading and discarding 5 batches"):
        resumed = train(make_settings(tmp_path), "stream")
    assert same(reference["model"], resumed["model"])


def test_resume_is_recorded_said_and_unattached_objects_are_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PRUDENT_RUN_ID", "r1")
    settings = make_settings(tmp_path)
    train(settings, "generator", stop_at=7)
    assert "resumed" not in capsys.readouterr().err
    run = prudent.init(name="r", settings=make_settings(tmp_path, console={"mode": "plain"}),
                       exit_on_stop=False)
    # the relaunched script's console says where it picks up
    assert ("prudent | r1 | resumed from ckpt-0000000007: step 7, epoch 1, 7 batches into it"
            in capsys.readouterr().err)
    run.attach(model=torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5),
                                         torch.nn.Linear(16, 2)))
    assert run.state.step == 7
    run.context.finish("completed")
    store = Store.open(settings.store)
    messages = {e["name"]: e["message"] for e in store.events("r1")}
    store.close()
    assert messages["resumed"].startswith("resumed from ckpt-0000000007: step 7, epoch 1, 7 batches")
    assert "holds counters, optimizer, scheduler but the script never attached it" in messages["not_restored"]


def test_only_corrupt_checkpoints_start_fresh_or_refuse_when_strict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PRUDENT_RUN_ID", "r1")
    train(make_settings(tmp_path), "generator", stop_at=7)
    for state in (tmp_path / "runs" / "r1" / "checkpoints").glob("ckpt-*/state.pt"):
        state.write_bytes(state.read_bytes()[:100])
    fresh = train(make_settings(tmp_path), "generator")
    assert fresh["step"] == 36 and "starting from scratch" in capsys.readouterr().err
    train(make_settings(tmp_path), "generator", stop_at=40)  # completes; leaves good checkpoints
    for state in (tmp_path / "runs" / "r1" / "checkpoints").glob("ckpt-*/state.pt"):
        state.write_bytes(b"")
    strict = make_settings(tmp_path, checkpoint={"strict_resume": True})
    with pytest.raises(prudent.ConfigError, match="strict_resume is on"):
        prudent.init(name="r", settings=strict, exit_on_stop=False)


def train_sampling(settings: ProjectSettings, stop_at: int | None = None) -> dict[str, Any]:
    """A nanoGPT-style loop whose batches come from the script's own torch.Generator."""
    torch.manual_seed(0)
    data = torch.randn(500, 8)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampling = torch.Generator().manual_seed(7)
    run = prudent.init(name="g", settings=settings, exit_on_stop=False)
    if stop_at:
        run.context.add_component(StopAtStep(stop_at))
    run.attach(model=model, optimizer=opt, sampling=sampling)
    with run:
        for _ in run.steps(20):
            x = data[torch.randint(len(data), (16,), generator=sampling)]
            loss = F.cross_entropy(model(x), (x[:, 0] > 0).long())
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
    return {"status": run.status, "step": run.state.step, "model": model.state_dict()}


def test_a_scripts_own_generator_attached_resumes_exactly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUDENT_RUN_ID", "reference")
    reference = train_sampling(make_settings(tmp_path))
    monkeypatch.setenv("PRUDENT_RUN_ID", "victim")
    assert train_sampling(make_settings(tmp_path), stop_at=9)["step"] == 9
    resumed = train_sampling(make_settings(tmp_path))
    assert resumed["status"] == "completed" and resumed["step"] == 20
    assert same(reference["model"], resumed["model"])  # the same batches drawn after step 9


def test_attaching_something_that_cannot_be_restored_is_an_error(settings: ProjectSettings) -> None:
    run = prudent.init(name="r", settings=settings, exit_on_stop=False)
    with pytest.raises(prudent.ConfigError, match=r"run.attach\(epochs=...\) got a int"):
        run.attach(epochs=3)
    run.context.finish("completed")


def test_auto_interval_saves_rarely_on_fast_steps(settings: ProjectSettings) -> None:
    """A regression: auto used to save at nearly every step while its first write was in flight."""
    run = prudent.init(name="fast", settings=settings, exit_on_stop=False)
    weights = torch.zeros(2_000_000)
    run.attach(weights=weights)
    with run:
        for _ in run.epochs(1):
            for _ in run.batches(range(300)):
                weights.add_(1.0)
                run.step(loss=1.0)
    store = Store.open(settings.store)
    saves = [e for e in store.events(run.id) if e["name"] == "saved"]
    store.close()
    assert 1 <= len(saves) <= 3  # the measuring save, maybe the epoch end; not hundreds


class SlowToSerialise:
    """An attached object whose state takes the training thread 60 ms to build (an adapter's
    framework checkpoint serialised in memory: Lightning's, Hugging Face's live files)."""

    def state_dict(self) -> dict[str, Any]:
        import time

        time.sleep(0.06)
        return {"blob": torch.zeros(4)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_saves_stall_counts_building_its_payload(tmp_path: Path, mode: str) -> None:
    # the automatic schedule spaces saves by this stall: one that left out the framework's
    # serialisation on the training thread saved an adapter's run too often
    settings = make_settings(tmp_path, checkpoint={"every": "2steps", "mode": mode})
    run = prudent.init(name="slow", settings=settings, exit_on_stop=False)
    model = torch.nn.Linear(2, 1)
    run.attach(model=model, framework=SlowToSerialise())
    with run:
        for _ in run.steps(4):
            run.backward(model(torch.ones(1, 2)).sum())
            run.step()
    store = Store(f"sqlite:///{tmp_path / 'prudent.db'}")
    try:
        saves = [e for e in store.events(run.id) if e["kind"] == "checkpoint" and e["name"] == "saved"]
    finally:
        store.close()
    assert saves and all(e["payload"]["stall_s"] >= 0.06 for e in saves), saves


def spiking_run(settings: ProjectSettings, stop_at: int | None = None) -> dict[str, Any]:
    """Six epochs of 32 batches with a lasting loss spike at steps 101-112: loss_spike rolls
    back to the step-96 checkpoint and skips the next 8 batches of epoch 4."""
    from prudent.testing import tiny_loader, tiny_model

    torch.manual_seed(0)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = prudent.init(name="spike", settings=settings, exit_on_stop=False)
    if stop_at:
        run.context.add_component(StopAtStep(stop_at))
    run.attach(model=model, optimizer=opt)
    loader = tiny_loader(num_samples=32 * 8, batch_size=8)
    with run:
        for _ in run.epochs(6):
            for x, y in run.batches(loader):
                step = run.state.step + 1
                loss = F.cross_entropy(model(-x if 101 <= step <= 112 else x), y)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
    return {"status": run.status, "step": run.state.step, "model": model.state_dict()}


@pytest.mark.parametrize("stop", ["after_the_skip", "at_the_rollback"])
def test_a_resume_after_a_rollback_that_skipped_batches_is_exact(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: str) -> None:
    # the skipped batches were drawn from the epoch: its position must count them, or a resume
    # later in that epoch serves them again and everything after them shifts; stopped at the
    # rollback's own step, the checkpoint holds the skip still to come: the resumed run makes
    # it, and counts it too (stopped again later in the epoch and resumed, it is still exact)
    def settings() -> ProjectSettings:
        # the monitor's cadence pinned: by default it follows the measured step time, so the
        # step a check (and the rollback) lands on may differ between the reference and the
        # stopped run, and "stopped at the rollback's own step" would not be
        return make_settings(tmp_path, monitor={"max_check_every_steps": 10,
                                                "grad_norm_every_steps": 1, "overhead_budget": 1.0,
                                                "rules": {"loss_spike": {"max_skips": 1}},
                                                "actions": {"rollback": {"skip_batches": 8}}},
                             checkpoint={"every": "20steps", "keep": 2})

    monkeypatch.setenv("PRUDENT_RUN_ID", "reference")
    reference = spiking_run(settings())
    assert (reference["status"], reference["step"]) == ("completed", 6 * 32 - 8)
    store = Store(f"sqlite:///{tmp_path / 'prudent.db'}")
    try:
        (rollback,) = [e for e in store.events("reference") if e["name"] == "rollback"]
    finally:
        store.close()
    stop_at = 118 if stop == "after_the_skip" else rollback["step"]
    monkeypatch.setenv("PRUDENT_RUN_ID", "victim")
    assert spiking_run(settings(), stop_at=stop_at)["status"] == "stopped"
    if stop == "at_the_rollback":
        assert spiking_run(settings(), stop_at=118)["status"] == "stopped"
    resumed = spiking_run(settings())
    assert (resumed["status"], resumed["step"]) == ("completed", reference["step"])
    assert same(reference["model"], resumed["model"])


def train_evaluated(settings: ProjectSettings, crash_at: int | None = None,
                    sched_after_log: bool = False,
                    stop_in_epoch: int | None = None) -> dict[str, Any]:
    """The README's loop: an epoch of batches, then the epoch's end as scripts write it (the
    scheduler stepped per epoch, before the evaluation or, ``sched_after_log``, after its
    run.log; an evaluation that draws from the global generator; run.log); early stopping
    keeps a checkpoint of each new best from inside that run.log. ``stop_in_epoch``: a
    preemption notice (SIGTERM) arrives during that epoch's evaluation."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    run = prudent.init(name="r", settings=settings, exit_on_stop=False)
    run.attach(model=model, optimizer=opt, scheduler=sched)
    loader = make_loader("global_rng")
    val_x = torch.randn(64, 8, generator=torch.Generator().manual_seed(9))
    with run:
        for epoch in run.epochs(4):
            for x, y in run.batches(loader):
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
                opt.step()
                opt.zero_grad()
                run.step(loss=loss)
                if run.state.step == crash_at:
                    raise RuntimeError("the machine goes away")
            if not sched_after_log:
                sched.step()
            model.eval()
            with torch.no_grad():
                picked = val_x[torch.randperm(64)[:48]]  # the global generator, as nanoGPT's
                val_loss = F.cross_entropy(model(picked), (picked[:, 0] > 0).long())
            model.train()
            if epoch == stop_in_epoch:
                run.context.request_stop("preempted", "SIGTERM during the evaluation")
            run.log(val_loss=val_loss)
            if sched_after_log:
                sched.step()
    return {"status": run.status, "step": run.state.step, "model": model.state_dict(),
            "opt": opt.state_dict(), "sched": sched.state_dict(), "rng": torch.get_rng_state()}


@pytest.mark.parametrize("sched_after_log", [False, True], ids=["sched_then_eval",
                                                                "eval_then_sched"])
def test_a_stop_during_an_epochs_evaluation_resumes_exactly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sched_after_log: bool) -> None:
    # the stop is made once the epoch's end has run whole: raised at run.log, a loop that
    # steps its scheduler after the evaluation resumed in the next epoch without that step
    only_the_stop = {"checkpoint": {"every": "off", "at_epoch_end": False}}
    monkeypatch.setenv("PRUDENT_RUN_ID", "reference")
    reference = train_evaluated(make_settings(tmp_path, **only_the_stop),
                                sched_after_log=sched_after_log)
    assert (reference["status"], reference["step"]) == ("completed", 48)
    monkeypatch.setenv("PRUDENT_RUN_ID", "victim")
    stopped = train_evaluated(make_settings(tmp_path, **only_the_stop),
                              sched_after_log=sched_after_log, stop_in_epoch=1)
    assert (stopped["status"], stopped["step"]) == ("stopped", 24)
    assert stopped["sched"] == reference["sched"] | {"last_epoch": 2, "_step_count": 3,
                                                     "_last_lr": [0.025]}
    resumed = train_evaluated(make_settings(tmp_path, **only_the_stop),
                              sched_after_log=sched_after_log)
    assert_resumed_exactly(tmp_path, reference, resumed)


@pytest.mark.parametrize("sched_after_log", [False, True], ids=["sched_then_eval",
                                                                "eval_then_sched"])
def test_a_crash_after_a_best_checkpoint_kept_at_an_epochs_end_resumes_exactly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sched_after_log: bool) -> None:
    # early stopping asks for its best checkpoint from the evaluation's run.log: resumed
    # there, the epoch's end must not run again (a second scheduler step: the learning rate
    # halved twice, an evaluation logged twice), nor be missing a scheduler step the loop
    # makes after that run.log
    only_kept = {"checkpoint": {"every": "off", "at_epoch_end": False}}
    monkeypatch.setenv("PRUDENT_RUN_ID", "reference")
    reference = train_evaluated(make_settings(tmp_path, **only_kept),
                                sched_after_log=sched_after_log)
    assert (reference["status"], reference["step"]) == ("completed", 48)
    monkeypatch.setenv("PRUDENT_RUN_ID", "victim")
    with pytest.raises(RuntimeError, match="goes away"):
        train_evaluated(make_settings(tmp_path, **only_kept), crash_at=30,
                        sched_after_log=sched_after_log)
    store = Store(f"sqlite:///{tmp_path / 'prudent.db'}")
    try:
        kept = [e["step"] for e in store.events("victim") if e["name"] == "saved"]
    finally:
        store.close()
    assert kept and kept[-1] == 24  # the newest: the best of epoch 2's evaluation
    resumed = train_evaluated(make_settings(tmp_path, **only_kept),
                              sched_after_log=sched_after_log)
    assert_resumed_exactly(tmp_path, reference, resumed)


def assert_resumed_exactly(tmp_path: Path, reference: dict[str, Any],
                           resumed: dict[str, Any]) -> None:
    """The resumed 'victim' run ended as the uninterrupted one, each evaluation logged once."""
    assert (resumed["status"], resumed["step"]) == ("completed", 48)
    assert resumed["sched"] == reference["sched"]
    assert same(reference["opt"], resumed["opt"]) and same(reference["model"], resumed["model"])
    assert torch.equal(reference["rng"], resumed["rng"])
    store = Store(f"sqlite:///{tmp_path / 'prudent.db'}")
    try:
        logged = [s for s, _ in store.metric_series("victim", "val_loss")]
    finally:
        store.close()
    assert logged == [12, 24, 36, 48]  # each evaluation once
