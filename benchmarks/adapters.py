"""What an adapter callback adds to a framework's step: the framework alone against the
framework with prudent's callback (and so every default component), interleaved in one run.

Each round trains the same model on the same data twice, once per arm, in alternating order
(A B, B A, ...); a minimal timing callback, present in both arms, times every optimizer step
from one ``on_train_batch_end`` to the next (the data wait included, as a user sees it). The
first ``--warmup`` steps of each fit are dropped. Per round the two arms' median steps give a
ratio; the report is the median of those ratios with their quartiles (target: <= 1.03). On a
shared machine those ratios swing by tens of percent, so the prudent arm also times every call
of the callback's hooks (everything the components do on the training thread included): its
median microseconds per step, as a share of the framework's own median step, is the steadier
figure (periodic work, a checkpoint save, is in neither median; the Hugging Face adapter's
forward hooks on the model are not in it: a few microseconds). The
prudent arm runs as a user's would: its own run in a throwaway home, default settings with
the console off (checkpoints on their automatic schedule, the monitor, profiler, cost meter).

On a machine other processes keep busy, ``--clock cpu`` times steps by the training thread's
CPU time (``time.thread_time``) instead of the wall clock.

Reproduce::

    python benchmarks/adapters.py                      # each framework, 6 rounds x 150 steps
    python benchmarks/adapters.py --rounds 10 --steps 300 --clock cpu
    python benchmarks/adapters.py --framework lightning --hidden 1024   # a ~10x longer step
    python benchmarks/adapters.py --framework keras    # Keras 3, torch backend (--hidden too)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "adapters.json"


HOOK_S: list[float] = []  # per step: seconds inside the prudent callback's hooks


def _timed(callback: Any, hooks: tuple[str, ...], clock: Any,
           inner: tuple[Any, tuple[str, ...]] | None = None) -> Any:
    """Time every call of the callback's ``hooks`` (and all they call: every component's
    handlers), on the same clock as the steps, summed per step (``hooks[-1]`` ends a step):
    steadier than a ratio of step times on a busy machine, since no other step's noise
    enters it."""
    HOOK_S.clear()
    current = [0.0]
    for name in hooks:
        method = getattr(callback, name)

        def timed(*args: Any, _method: Any = method, _ends: bool = name == hooks[-1],
                  **kwargs: Any) -> Any:
            started = clock()
            try:
                return _method(*args, **kwargs)
            finally:
                current[0] += clock() - started
                if _ends:
                    HOOK_S.append(current[0])
                    current[0] = 0.0

        setattr(callback, name, timed)
    if inner is not None:  # called from inside the framework's step, not from a hook
        owner, names = inner
        for name in names:
            method = getattr(owner, name)

            def timed_inner(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                started = clock()
                try:
                    return _method(*args, **kwargs)
                finally:
                    current[0] += clock() - started

            setattr(owner, name, timed_inner)
    return callback


LIGHTNING_HOOKS = ("on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start",
                   "on_before_backward", "on_before_optimizer_step", "on_train_batch_end")
TRANSFORMERS_HOOKS = ("on_epoch_begin", "on_epoch_end", "on_step_begin",
                      "on_pre_optimizer_step", "on_step_end")
HIDDEN = {"lightning": 64}  # the digits MLP's width (--hidden): a longer step, a smaller share


def _lightning_fit(with_prudent: bool, steps: int, clock: Any) -> list[float]:
    import lightning as L

    sys.path.insert(0, str(ROOT / "examples"))
    from lightning_digits import LitDigits, digits_loaders

    times: list[float] = []

    class StepTimes(L.Callback):
        last: float | None = None

        def on_train_batch_end(self, *args: Any) -> None:
            now = clock()
            if self.last is not None:
                times.append(now - self.last)
            self.last = now

    callbacks: list[Any] = [StepTimes()]
    if with_prudent:
        from prudent.lightning import PrudentCallback

        callbacks.append(_timed(PrudentCallback(name="bench-lightning", config={},
                                                exit_on_stop=False), LIGHTNING_HOOKS, clock))
    L.seed_everything(0, verbose=False)
    train, _ = digits_loaders(32)
    trainer = L.Trainer(max_steps=steps, callbacks=callbacks, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(LitDigits(lr=0.05, hidden=HIDDEN["lightning"]), train)
    return times


def _transformers_fit(with_prudent: bool, steps: int, clock: Any) -> list[float]:
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    sys.path.insert(0, str(ROOT / "examples"))
    from transformers_tiny_bert import LENGTH, VOCAB, MarkerSequences

    times: list[float] = []

    class StepTimes(TrainerCallback):
        last: float | None = None

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            now = clock()
            if self.last is not None:
                times.append(now - self.last)
            self.last = now

    callbacks: list[Any] = [StepTimes()]
    if with_prudent:
        from prudent.transformers import PrudentCallback

        callbacks.append(_timed(PrudentCallback(name="bench-transformers", config={},
                                                exit_on_stop=False), TRANSFORMERS_HOOKS, clock))
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=LENGTH, num_labels=2))
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=steps, save_strategy="no",
                                 report_to="none", use_cpu=True, disable_tqdm=True,
                                 per_device_train_batch_size=32, logging_steps=10**6,
                                 learning_rate=2e-3)
        Trainer(model=model, args=args, train_dataset=MarkerSequences(steps * 32, 0),
                callbacks=callbacks).train()
    return times


KERAS_HOOKS = ("on_epoch_begin", "on_epoch_end", "on_train_batch_end")


def _keras_fit(with_prudent: bool, steps: int, clock: Any) -> list[float]:
    """Keras 3 on the torch backend, the digits MLP of examples/keras_digits.py. The callback
    also runs inside Keras' step (the batch's arrival, the gradient rules before
    ``optimizer.apply``): those calls are timed too; only the few-line wrappers around them
    (and around the loss tracker's update) are not."""
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import keras
    import numpy as np

    sys.path.insert(0, str(ROOT / "examples"))
    from keras_digits import build, digits

    times: list[float] = []

    class StepTimes(keras.callbacks.Callback):
        last: float | None = None

        def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
            now = clock()
            if self.last is not None:
                times.append(now - self.last)
            self.last = now

    callbacks: list[Any] = [StepTimes()]
    if with_prudent:
        from prudent.keras import PrudentCallback

        callback = PrudentCallback(name="bench-keras", config={}, exit_on_stop=False)
        callbacks.append(_timed(callback, KERAS_HOOKS, clock,
                                inner=(callback.adapter, ("batch_loaded", "after_backward"))))
    keras.utils.set_random_seed(0)
    (x, y), _ = digits()
    repeat = -(-steps * 32 // len(x))
    x, y = np.concatenate([x] * repeat)[:steps * 32], np.concatenate([y] * repeat)[:steps * 32]
    build(HIDDEN["lightning"], 0.05).fit(x, y, epochs=1, batch_size=32, verbose=0,
                                         callbacks=callbacks)
    return times


FRAMEWORKS = {"lightning": _lightning_fit, "transformers": _transformers_fit,
              "keras": _keras_fit}


def compare(framework: str, rounds: int, steps: int, warmup: int, clock: Any) -> dict[str, Any]:
    fit = FRAMEWORKS[framework]
    ratios, medians = [], {"alone": [], "prudent": []}
    hook_us: list[float] = []  # the callback's hooks, microseconds per step (mean of a fit)
    for i in range(rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        round_medians = {}
        for with_prudent in order:
            times = fit(with_prudent, steps, clock)[warmup:]
            round_medians[with_prudent] = statistics.median(times)
            if with_prudent:  # the median step's share: periodic saves are not in it
                hook_us.append(statistics.median(HOOK_S[warmup:]) * 1e6)
        ratios.append(round_medians[True] / round_medians[False])
        medians["alone"].append(round_medians[False] * 1e3)
        medians["prudent"].append(round_medians[True] * 1e3)
        print(f"{framework} round {i + 1}/{rounds}: alone {round_medians[False] * 1e3:.3f} ms, "
              f"with prudent {round_medians[True] * 1e3:.3f} ms, ratio {ratios[-1]:.3f}",
              file=sys.stderr, flush=True)
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"framework": framework, "rounds": rounds, "steps": steps, "warmup": warmup,
            "hidden": HIDDEN.get("lightning" if framework == "keras" else framework),
            "median_step_ms_alone": statistics.median(medians["alone"]),
            "median_step_ms_prudent": statistics.median(medians["prudent"]),
            "callback_us_per_step": statistics.median(hook_us),
            "callback_share": statistics.median(hook_us) / 1e3 / statistics.median(medians["alone"]),
            "ratio_median": statistics.median(ratios), "ratio_q1": quartiles[0],
            "ratio_q3": quartiles[2], "ratios": ratios, "target": 1.03,
            "meets_target": statistics.median(ratios) <= 1.03}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=[*FRAMEWORKS, "all"], default="all")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--hidden", type=int, default=64,
                        help="the Lightning and Keras digits MLPs' width")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    HIDDEN["lightning"] = args.hidden
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    torch.set_num_threads(1)
    names = list(FRAMEWORKS) if args.framework == "all" else [args.framework]
    with tempfile.TemporaryDirectory() as home:
        os.environ.update(PRUDENT_HOME=home, PRUDENT_CONSOLE="off")
        results = [compare(n, args.rounds, args.steps, args.warmup, clock) for n in names]
    print(f"{'framework':<12}{'alone ms':>10}{'prudent ms':>12}{'ratio':>8}{'q1-q3':>14}"
          f"{'hooks us':>10}{'share':>8}  target (ratio <= 1.03)")
    for r in results:
        print(f"{r['framework']:<12}{r['median_step_ms_alone']:>10.3f}"
              f"{r['median_step_ms_prudent']:>12.3f}{r['ratio_median']:>8.3f}"
              f"{r['ratio_q1']:>7.3f}-{r['ratio_q3']:.3f}{r['callback_us_per_step']:>10.1f}"
              f"{r['callback_share']:>8.1%}  {'met' if r['meets_target'] else 'MISSED'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                    "clock": args.clock, "torch": torch.__version__,
                                    "cpus": os.cpu_count(), "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
