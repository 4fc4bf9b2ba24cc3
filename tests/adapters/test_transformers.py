"""prudent.transformers in this process: a checkpoint restored while the Hugging Face Trainer
trains (a rule's rollback, early stopping's best weights) changes the live model, optimizer and
LR scheduler, not only the next resume; loss_spike's skip skips the Trainer's update."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from prudent.kernel.events import Component

pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

VOCAB, LENGTH = 64, 16
# a spike's clipped gradients are concentrated in the classifier: vanishing_gradient (being
# reworked) may judge that step, which is not what the spike tests are about
CALM = {"vanishing_gradient": {"enabled": False}}


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    """One intra-op thread: on a loaded 2-core machine two threads spin against each other
    (12 steps of this BERT: 3.8 s with two, 0.12 s with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _Sequences(torch.utils.data.Dataset):
    """Generated token sequences; the label says whether token 7 occurs in them."""

    def __init__(self, num: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(8, VOCAB, (num, LENGTH), generator=generator)
        marked = torch.rand(num, generator=generator) < 0.5
        self.ids[marked, 3] = 7
        self.labels = marked.long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class _SpikyBert(transformers.BertForSequenceClassification):
    """A 2-layer BERT whose training loss is ``spike`` times larger on the forwards listed in
    ``spike_at`` (1-based; one forward per optimizer step here): an injected loss spike."""

    spike_at: frozenset[int] = frozenset()
    spike = 1000.0
    forwards = 0

    def forward(self, **inputs: Any) -> Any:
        output = super().forward(**inputs)
        if self.training:
            self.forwards += 1
            if self.forwards in self.spike_at:
                output.loss = output.loss * self.spike
        return output


def _model() -> _SpikyBert:
    torch.manual_seed(0)
    return _SpikyBert(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=LENGTH, num_labels=2))


def _trainer(tmp_path: Path, model: Any, callbacks: list[Any], **args: Any) -> Any:
    settings = {"output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 8,
                "learning_rate": 1e-3, "warmup_steps": 4, "save_strategy": "no",
                "logging_steps": 1000, "report_to": "none", "use_cpu": True,
                "disable_tqdm": True, "seed": 0, "remove_unused_columns": False,
                "label_names": ["labels"], **args}
    return transformers.Trainer(model=model, args=transformers.TrainingArguments(**settings),
                                train_dataset=_Sequences(256), eval_dataset=_Sequences(32, 1),
                                callbacks=callbacks)


class _Probe(Component):
    """Reads the Trainer's own model, optimizer and LR scheduler; ``act`` runs at the end of
    the steps it names (after the monitor's own work of that step)."""

    name = "probe"

    def __init__(self, act: dict[int, Any] | None = None) -> None:
        self.trainer: Any = None
        self.act = act or {}
        self.states: dict[int, dict[str, torch.Tensor]] = {}

    def on_step_end(self, run: Any, metrics: dict[str, Any]) -> None:
        if run.state.step in self.act:
            self.act[run.state.step](run)

    def state(self) -> dict[str, torch.Tensor]:
        """The weights, Adam's moments and the scheduler's position, as they are now."""
        model, optimizer = self.trainer.model, self.trainer.optimizer
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for i, param in enumerate(model.parameters()):
            for key in ("exp_avg", "exp_avg_sq"):
                state[f"{key}{i}"] = optimizer.state[param][key].clone()
        state["scheduler_epoch"] = torch.tensor(self.trainer.lr_scheduler.last_epoch)
        return state


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert torch.equal(value, b[key]), key


def _monitor(cb: Any) -> Any:
    return next(c for c in cb.adapter.ctx.components if type(c).__name__ == "Monitor")


def test_a_rollback_puts_the_trainers_live_weights_optimizer_and_scheduler_back(
        tmp_path: Path) -> None:
    from prudent.monitor.actions import Firing
    from prudent.monitor.base import Finding
    from prudent.testing import make_settings
    from prudent.transformers import PrudentCallback

    settings = make_settings(tmp_path, checkpoint={"every": "5steps", "at_epoch_end": False},
                             monitor={"actions": {"rollback": {"lr_factor": 0.5}}})
    cb = PrudentCallback("roll", {}, exit_on_stop=False, settings=settings)
    outcome: list[str] = []
    probe = _Probe()
    probe.act = {  # the monitor's own rollback action, as loss_spike runs it
        5: lambda run: probe.states.update({5: probe.state()}),
        8: lambda run: (outcome.append(_monitor(cb).actions["rollback"].apply(
            run, Firing("loss_spike", Finding(8, 9.0, 2.0, "a spike", since=6), 8))),
            probe.states.update({8: probe.state()}))}
    cb.adapter.ctx.add_component(probe)
    trainer = probe.trainer = _trainer(tmp_path, _model(), [cb], max_steps=12)
    trainer.train()

    assert "back to step 5" in outcome[0] and "learning rate 0.000875 -> 0.000438" in outcome[0]
    # the live objects (not only a file for the next resume) are as they were at step 5;
    # the schedule stands where it stood then
    _assert_equal(probe.states[5], probe.states[8])
    scheduler = trainer.lr_scheduler
    assert scheduler.base_lrs == [pytest.approx(5e-4)] * 2  # lr_factor reached the schedule too
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(
        5e-4 * scheduler.lr_lambdas[0](9))  # stepped 4 times since, on the halved base
    assert trainer.state.global_step == 12 and cb.run.stop_reason is None  # counters go on


def test_a_real_loss_spike_is_rolled_back_to_the_checkpoint_before_it(tmp_path: Path) -> None:
    from prudent.testing import make_settings
    from prudent.transformers import PrudentCallback

    settings = make_settings(tmp_path, checkpoint={"every": "10steps", "at_epoch_end": False},
                             monitor={"check_every_steps": 1,
                                      "rules": {"loss_spike": {"action": ["rollback"]}, **CALM}})
    cb = PrudentCallback("spike", {}, exit_on_stop=False, settings=settings)
    probe = _Probe()
    probe.act = {step: lambda run: probe.states.update({run.state.step: probe.state()})
                 for step in range(38, 52)}
    cb.adapter.ctx.add_component(probe)
    model = _model()
    model.spike, model.spike_at = 10.0, frozenset(range(41, 49))  # 10x the loss, 8 steps
    trainer = probe.trainer = _trainer(tmp_path, model, [cb], max_steps=52)
    trainer.train()

    rollbacks = [e for e in cb.adapter.ctx.store.events(cb.run.id)
                 if (e["kind"], e["name"]) == ("monitor", "rollback")]
    assert len(rollbacks) == 1, rollbacks
    event = rollbacks[0]
    assert (event["payload"]["spike_step"], event["payload"]["checkpoint_step"]) == (41, 40)
    # right after the rollback (the end of the step that detected it) the live weights,
    # moments and schedule are those of step 40's checkpoint
    _assert_equal(probe.states[40], probe.states[event["step"]])
    assert trainer.state.global_step == 52 and cb.run.stop_reason is None


def test_early_stopping_puts_the_best_evaluations_weights_back_when_it_stops(
        tmp_path: Path) -> None:
    from prudent.testing import make_settings
    from prudent.transformers import PrudentCallback

    scores = iter([0.5, 0.9, 0.6, 0.6, 0.6, 0.6])
    settings = make_settings(tmp_path, monitor={"rules": {"early_stopping": {
        "metric": "eval_score", "mode": "max", "patience": 2}}})
    cb = PrudentCallback("best", {}, exit_on_stop=False, settings=settings)
    probe = _Probe()
    evaluated: dict[int, dict[str, torch.Tensor]] = {}

    class Snapshot(transformers.TrainerCallback):  # the weights each evaluation saw
        def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            evaluated[state.global_step] = probe.state()

    cb.adapter.ctx.add_component(probe)
    trainer = probe.trainer = _trainer(tmp_path, _model(), [Snapshot(), cb], max_steps=30,
                                       eval_steps=3, eval_strategy="steps")
    trainer.compute_metrics = lambda prediction: {"score": next(scores)}
    trainer.train()

    assert cb.run.stop_reason == "rule:early_stopping"
    # the model's metrics are logged; the Trainer's timing of its evaluation and its epoch not
    logged = cb.adapter.ctx.logged
    assert "eval_score" in logged and "eval_loss" in logged
    assert not [k for k in logged if k == "epoch" or k.endswith(("_runtime", "_per_second"))]
    assert sorted(evaluated) == [3, 6, 9, 12]  # the best at step 6, no better one after it
    assert trainer.state.global_step == 12
    final = probe.state()
    _assert_equal(evaluated[6], final)  # the weights, moments and schedule of the best
    assert not torch.equal(evaluated[12]["classifier.weight"], final["classifier.weight"])


def test_loss_spikes_skip_update_is_not_applied_by_the_trainer(tmp_path: Path) -> None:
    from prudent.testing import make_settings
    from prudent.transformers import PrudentCallback

    settings = make_settings(tmp_path, monitor={"check_every_steps": 1, "rules": CALM})
    cb = PrudentCallback("skip", {}, exit_on_stop=False, settings=settings)
    probe = _Probe()
    probe.act = {39: lambda run: probe.states.update({39: probe.state()}),
                 40: lambda run: probe.states.update({40: probe.state()}),
                 41: lambda run: probe.states.update({41: probe.state()})}
    cb.adapter.ctx.add_component(probe)
    model = _model()
    model.spike_at = frozenset({40})
    trainer = probe.trainer = _trainer(tmp_path, model, [cb], max_steps=42)
    trainer.train()

    skipped = [e for e in cb.adapter.ctx.store.events(cb.run.id)
               if (e["kind"], e["name"]) == ("monitor", "skipped_update")]
    assert [e["step"] for e in skipped] == [40]
    before, after = probe.states[39], probe.states[40]
    for key in before:  # weights and moments untouched; the schedule stepped as usual
        assert torch.equal(before[key], after[key]) is (key != "scheduler_epoch"), key
    assert not torch.equal(after["classifier.weight"], probe.states[41]["classifier.weight"])
    assert trainer.state.global_step == 42 and cb.run.stop_reason is None
    # the LR scheduler's wrapper of accelerate's optimizer.step is still there
    assert getattr(trainer.optimizer.step, "_wrapped_by_lr_sched", False)


class _SkipEveryUpdate(Component):
    """Makes each watched torch optimizer's next ``step()`` a no-op before every update, as
    the monitor's skip of an outlier does (an instance attribute that removes itself)."""

    name = "skip_every_update"

    def __init__(self) -> None:
        self.optimizers: list[Any] = []
        self.skipped = 0

    def on_attach(self, run: Any, objects: dict[str, Any]) -> None:
        self.optimizers += [o for o in objects.values() if isinstance(o, torch.optim.Optimizer)]

    def on_after_backward(self, run: Any, loss: Any) -> None:
        for optimizer in self.optimizers:
            optimizer.step = lambda *args, _o=optimizer, **kwargs: (
                vars(_o).pop("step"), setattr(self, "skipped", self.skipped + 1))


class _LinearWithLoss(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # as a HF model returns
        return {"loss": super().forward(x).square().mean()}


def test_a_skip_reaches_an_optimizer_that_accelerate_steps_through_a_grad_scaler(
        tmp_path: Path) -> None:
    # with fp16 on a GPU the Trainer steps accelerate's wrapper, which puts a step() of its
    # own on the torch optimizer for the GradScaler: the monitor's no-op would be bypassed
    from types import SimpleNamespace

    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    from prudent.testing import make_settings
    from prudent.transformers import PrudentCallback

    Accelerator(cpu=True)
    cb = PrudentCallback("amp", {}, exit_on_stop=False, settings=make_settings(tmp_path))
    skipper = _SkipEveryUpdate()
    cb.adapter.ctx.add_component(skipper)
    model = _LinearWithLoss(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    wrapper = AcceleratedOptimizer(optimizer, scaler=scaler)
    hook = SimpleNamespace(global_step=0, max_steps=2, num_train_epochs=1)
    cb.on_train_begin(None, hook, None, model=model, optimizer=wrapper)
    before = model.weight.detach().clone()
    for _ in range(2):
        scaler.scale(model(torch.randn(3, 4))["loss"]).backward()
        cb.on_pre_optimizer_step(None, hook, None)
        wrapper.step()  # what the Trainer calls
        wrapper.zero_grad()
    cb.adapter.finish()

    assert skipper.skipped == 2 and torch.equal(before, model.weight)
    assert "step" not in vars(wrapper)  # the wrapper's own step() again for the next update


def test_a_restored_checkpoint_holding_a_trainer_folder_is_loaded_from_the_trainers_files(
        tmp_path: Path) -> None:
    # a rollback after a resume can go back to the stop's checkpoint of the attempt before,
    # which carries the folder the Trainer wrote (save_pretrained's safetensors, optimizer.pt)
    from prudent.testing import make_settings
    from prudent.transformers import PrudentCallback

    cb = PrudentCallback("folder", {}, exit_on_stop=False, settings=make_settings(tmp_path))
    probe = _Probe()
    folder = tmp_path / "out" / "checkpoint-3"

    def restore(run: Any) -> None:
        files = {p.relative_to(folder.parent).as_posix(): p.read_bytes()
                 for p in folder.rglob("*") if p.is_file()}
        cb.adapter.framework_checkpoint.load_state_dict({"entry": folder.name, "files": files})
        probe.states[5] = probe.state()

    probe.act = {3: lambda run: probe.states.update({3: probe.state()}), 5: restore}
    cb.adapter.ctx.add_component(probe)
    trainer = probe.trainer = _trainer(tmp_path, _model(), [cb], max_steps=6,
                                       save_strategy="steps", save_steps=3)
    trainer.train()  # (its checkpoints' tqdm bar leaves no thread behind: the callback ends it)

    _assert_equal(probe.states[3], probe.states[5])
    assert trainer.state.global_step == 6


def test_prudents_checkpoint_between_the_trainers_saves_is_the_folder_the_trainer_writes(
        tmp_path: Path) -> None:
    # on a spot VM the Trainer's own folders die with the disk: the run resumes from prudent's
    # live/, so it must hold what Trainer._save_checkpoint writes at that step, file for file
    import io
    import json

    from safetensors.torch import load
    from transformers.trainer_pt_utils import safe_globals

    from prudent.testing import make_settings
    from prudent.transformers import PrudentCallback

    cb = PrudentCallback("live", {}, exit_on_stop=False, settings=make_settings(
        tmp_path, checkpoint={"every": "100steps", "at_epoch_end": False}))
    taken: dict[str, Any] = {}
    probe = _Probe({3: lambda run: taken.update(cb.adapter.framework_checkpoint.state_dict())})
    cb.adapter.ctx.add_component(probe)
    trainer = probe.trainer = _trainer(
        tmp_path, _model(), [cb, transformers.EarlyStoppingCallback(2)], max_steps=4,
        save_strategy="steps", save_steps=3, eval_strategy="steps", eval_steps=2,
        metric_for_best_model="eval_loss")
    trainer.train()

    ours = {name.removeprefix("live/"): bytes(data.numpy())
            for name, data in taken["files"].items()}
    theirs = tmp_path / "out" / "checkpoint-3"
    assert taken["entry"] == "live"
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth",
            "trainer_state.json"} <= ours.keys()
    _assert_equal(load(ours["model.safetensors"]),
                  load((theirs / "model.safetensors").read_bytes()))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        with safe_globals():  # NumPy's generator state: loaded as the Trainer loads it
            mine = torch.load(io.BytesIO(ours[name]), weights_only=True)
            assert repr(mine) == repr(torch.load(theirs / name, weights_only=True)), name
    state = json.loads(ours["trainer_state.json"])
    trainer_state = json.loads((theirs / "trainer_state.json").read_text())
    # (the Trainer logs after its callbacks' on_step_end, where prudent's checkpoint is taken)
    logged, trainer_logged = state.pop("log_history"), trainer_state.pop("log_history")
    assert state["global_step"] == 3 and logged == trainer_logged[:len(logged)]
    assert state == trainer_state  # the early stopping callback's counter included


class _StopAt(transformers.TrainerCallback):
    """Ends ``train()`` after ``step`` optimizer steps, as the Trainer's own stop does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= self.step:
            control.should_training_stop = True


@pytest.mark.parametrize(("args", "planned"), [
    ({"max_steps": 300, "num_train_epochs": 3}, 300),  # 3 epochs of 32 steps would be 96
    ({"num_train_epochs": 2, "gradient_accumulation_steps": 3}, 22),  # 2 x ceil(32 / 3)
    ({"num_train_epochs": 1.5}, 48),  # a fraction of an epoch: ceil(1.5 x 32)
])
def test_the_rules_are_sized_to_the_trainers_planned_optimizer_steps(
        tmp_path: Path, args: dict[str, Any], planned: int) -> None:
    # the monitor sizes its rules' windows to the run's planned length: under max_steps the
    # Trainer's epochs are not the plan (a user trial read 96 planned steps for max_steps=300)
    from prudent.testing import make_settings
    from prudent.transformers import PrudentCallback

    cb = PrudentCallback("plan", {}, exit_on_stop=False, settings=make_settings(tmp_path))
    trainer = _trainer(tmp_path, _model(), [cb, _StopAt(3)], **args)
    trainer.train()

    assert trainer.state.max_steps == planned  # what the Trainer itself plans
    assert _monitor(cb)._fitted_for == planned
    assert cb.run.context.state.num_steps == planned


@pytest.mark.parametrize(("accumulation", "skip", "untouched"), [
    (1, 5, 5),  # five steps of one batch each: none of them updates the model
    (2, 3, 1),  # one step of two batches, then one of the next step's two: its gradient goes
])
def test_a_rollback_trains_none_of_the_batches_it_skips(
        tmp_path: Path, accumulation: int, skip: int, untouched: int) -> None:
    # the Trainer draws its own batches: the skip_batches after a rollback are drawn, but
    # their gradients are dropped and no update is made from them
    from prudent.testing import make_settings
    from prudent.transformers import PrudentCallback

    settings = make_settings(
        tmp_path, checkpoint={"every": "10steps", "at_epoch_end": False},
        monitor={"check_every_steps": 1, "actions": {"rollback": {"skip_batches": skip}},
                 "rules": {"loss_spike": {"action": ["rollback"]}, **CALM,
                           # a 60-step run: the test process's RSS may grow by checkpoints
                           "memory_growth": {"enabled": False}}})
    cb = PrudentCallback("skip-batches", {}, exit_on_stop=False, settings=settings)
    probe = _Probe()
    probe.act = {step: lambda run: probe.states.update({run.state.step: probe.state()})
                 for step in range(36, 60)}
    cb.adapter.ctx.add_component(probe)
    model = _model()
    # 10x the loss in steps 41-48 (counted in forwards: one a micro-batch): fires at step 45
    model.spike, model.spike_at = 10.0, frozenset(range(40 * accumulation + 1,
                                                        48 * accumulation + 1))
    trainer = probe.trainer = _trainer(tmp_path, model, [cb], max_steps=60,
                                       gradient_accumulation_steps=accumulation,
                                       per_device_train_batch_size=8 // accumulation)
    trainer.train()

    events = cb.adapter.ctx.store.events(cb.run.id)
    rollbacks = [e for e in events if (e["kind"], e["name"]) == ("monitor", "rollback")]
    assert len(rollbacks) == 1, rollbacks
    at = rollbacks[0]["step"]
    assert f"skipping the next {skip} batches" in rollbacks[0]["message"]
    for step in range(at + 1, at + untouched + 1):  # weights and moments as rolled back
        state = probe.states[step]
        for key, value in probe.states[at].items():
            assert torch.equal(value, state[key]) is (key != "scheduler_epoch"), (step, key)
    after = probe.states[at + untouched + 1]
    assert not torch.equal(after["classifier.weight"], probe.states[at]["classifier.weight"])
    skipped = [e for e in events if (e["kind"], e["name"]) == ("monitor", "skipped_update")]
    assert len(skipped) == 1, skipped
    payload = skipped[0]["payload"]
    assert (payload["reason"], payload["batches"]) == ("rollback", skip)
    assert (payload["first_step"], payload["last_step"]) == (at + 1, at + -(-skip // accumulation))
    assert trainer.state.global_step == 60 and cb.run.stop_reason is None, (
        cb.run.stop_reason, [(e["step"], e["name"], e["message"]) for e in events
                             if e["kind"] != "checkpoint" and e["step"] > 50])
    # the LR scheduler's wrapper of accelerate's optimizer.step is back in place after the
    # skipped updates, and no no-op is left on the torch optimizer
    assert getattr(trainer.optimizer.step, "_wrapped_by_lr_sched", False)
    assert "step" not in vars(trainer.optimizer.optimizer)


def test_the_trainers_checkpoints_leave_no_tqdm_thread_behind(tmp_path: Path) -> None:
    # save_pretrained's "Writing model shards" bar starts tqdm's monitor thread (disable_tqdm
    # or not), which tqdm ends only with the process
    import threading

    from prudent.testing import make_settings
    from prudent.transformers import PrudentCallback

    if any(t.name == "tqdm_monitor" for t in threading.enumerate()):
        pytest.skip("tqdm's monitor thread runs already in this process")
    cb = PrudentCallback("tqdm", {}, exit_on_stop=False, settings=make_settings(tmp_path))
    trainer = _trainer(tmp_path, _model(), [cb], max_steps=4, save_strategy="steps",
                       save_steps=2)
    trainer.train()

    assert (tmp_path / "out" / "checkpoint-4").is_dir()
    assert [t.name for t in threading.enumerate() if t.name == "tqdm_monitor"] == []
