"""What an adapter callback adds to a framework's step: the framework alone against the
framework with prudent's callback (and so every default component), interleaved in one run.

Each round trains the same model on the same data twice, once per arm, in alternating order
(A B, B A, ...), each fit one epoch of ``--steps`` batches (as ``overhead.py`` does; Lightning's
``--epoch-steps 45`` keeps the digits' own 45-step epochs, with prudent's checkpoint at each
epoch end), garbage collected before it starts. A minimal timing callback, present in both
arms, times every optimizer step from one ``on_train_batch_end`` to the next (the data wait
included, as a user sees it); the first ``--warmup`` steps of each fit are dropped. Per round:
the ratio of the two arms' median steps (the target: <= 1.03) and of their loop means (from the
warm-up's end to the end of the loop: the epoch-end save and other periodic work count
there), over the steps both arms trained: a monitoring rule that stops the prudent run early is
reported, and its round compares the common steps. The report is the median of the rounds'
ratios with their quartiles. The prudent arm also times every call of the callback's hooks
(everything the components do on the training thread included): the median and the mean
microseconds per step (the Hugging Face adapter's forward hook on the model is not in it: a
few microseconds). The prudent arm runs as a user's would: its own run in a throwaway home,
default settings with the console off (checkpoints on their automatic schedule, the monitor,
profiler, failure capture, cost meter, the record).

Where the median step's growth goes is printed too: the hooks and what is left, the
collector's collections during the steps (both arms), the CPU time of the other threads
(prudent's writer, record, checkpoint and sampler threads) and how often the training thread
waited (voluntary context switches: for the GIL, mostly) per step; ``--breakdown`` adds each
component handler's median per step, timed through ``RunContext.wrap_handlers``, and each timed
hook's (``hook <name>``: its handlers included, so the hook's own share is the difference).

On a machine other processes keep busy, ``--clock cpu`` times steps by the training thread's
CPU time (``time.thread_time``) instead of the wall clock; it leaves out the time the training
thread waits for the GIL while prudent's background threads (checkpoint writer, record, store
writer) hold it, so only the wall clock on a quiet machine answers the target.

Reproduce (a quiet machine: the load average is printed)::

    python benchmarks/adapters.py                      # each framework, 8 rounds x 400 steps
    python benchmarks/adapters.py --framework lightning --epoch-steps 45 --steps 150
    python benchmarks/adapters.py --framework lightning --hidden 1024   # a longer step
    python benchmarks/adapters.py --framework lightning --breakdown     # each handler too
    python benchmarks/adapters.py --clock cpu          # on a busy machine
"""

from __future__ import annotations

import argparse
import gc
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
sys.path.insert(0, str(ROOT / "benchmarks"))
from interleaved_ab import _bootstrap_ci  # noqa: E402 - the same interval as the kernel's A/B

RESULTS = ROOT / "benchmarks" / "results" / "adapters.json"


HOOK_S: list[float] = []  # per step: seconds inside the prudent callback's hooks
CALLBACK: list[Any] = [None]  # the prudent arm's callback (its run's stop reason, if any)
HOOK_LEFT = [0.0]  # hook time after the last step (the epoch-end save)
LOOP_TAIL = [0.0]  # from the last step's end to the loop's end (the epoch-end work, a save)
THREADS_CPU: list[dict[int, float]] = [{}, {}]  # other threads' CPU seconds: first step, end
GC_FIT = {"n": 0, "s": 0.0, "t0": 0.0, "on": False}  # collections during a fit's steps, time
BREAKDOWN = [False]  # --breakdown: time each component handler in the prudent arm
HANDLER_S: dict[str, list[float]] = {}  # per handler: seconds per step (--breakdown)
HANDLERS_STEP: list[Any] = [None]  # closes a step's handler sums (--breakdown)
BLOCKED = [0, 0]  # the training thread's voluntary context switches: first step, end


class _StepClock:
    """The step times of one fit, by the framework's own end-of-step and end-of-training hooks
    (each framework's callback below only forwards to it)."""

    def __init__(self, times: list[float], clock: Any) -> None:
        self.times, self.clock, self.last = times, clock, None

    def step_ended(self) -> None:
        now = self.clock()
        if self.last is not None:
            self.times.append(now - self.last)
        else:  # the steps start: count what the collector and the other threads do from here
            THREADS_CPU[0] = _other_threads_cpu()
            BLOCKED[0] = _times_blocked()
            GC_FIT.update(n=0, s=0.0, on=True)
        self.last = now

    def train_ended(self) -> None:  # after the epoch-end save (both arms)
        LOOP_TAIL[0] = self.clock() - self.last if self.last is not None else 0.0
        # before the prudent callback closes its run (its threads are still alive)
        THREADS_CPU[1] = _other_threads_cpu()
        BLOCKED[1] = _times_blocked()
        GC_FIT["on"] = False


EPOCH_STEPS: list[int | None] = [None]  # Lightning: steps per epoch (None: one epoch)


def _other_threads_cpu() -> dict[int, float]:
    """CPU seconds each thread but this one has used (prudent's writer, record, sampler and
    watchdog threads; the framework's): what they may have taken the GIL for meanwhile."""
    import threading

    got = {}
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.ident is None:
            continue
        try:
            got[thread.ident] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (AttributeError, OSError):  # not on this platform, or it has just ended
            continue
    return got


def _times_blocked() -> int:
    """How often the training thread has waited so far (voluntary context switches: for the
    GIL while another thread holds it, or for I/O); 0 where the platform does not count."""
    import resource

    try:
        return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return 0


def _gc_timer(phase: str, info: dict[str, Any]) -> None:
    """gc.callbacks: how many collections ran during a fit, and for how long (wall clock)."""
    if not GC_FIT["on"]:
        return
    if phase == "start":
        GC_FIT["t0"] = time.perf_counter()
    else:
        GC_FIT["n"] += 1
        GC_FIT["s"] += time.perf_counter() - GC_FIT["t0"]


def _time_handlers(callback: Any, clock: Any) -> None:
    """--breakdown: every component handler of the prudent run's per-step events timed call by
    call (``RunContext.wrap_handlers``), summed per step: who the hooks' time belongs to. The
    wrappers cost about a microsecond each, so the prudent arm is a little slower with it."""
    from prudent.kernel.events import Event

    ctx = callback.adapter.ctx
    current: dict[str, float] = {}

    def wrap(handler: Any) -> Any:
        name = getattr(handler, "__qualname__", repr(handler))

        def timed(*args: Any, _handler: Any = handler, _name: str = name) -> Any:
            started = clock()
            try:
                return _handler(*args)
            finally:
                current[_name] = current.get(_name, 0.0) + clock() - started
        return timed

    per_step = (Event.BATCH_LOADED, Event.AFTER_BACKWARD, Event.STEP_END)
    names = {getattr(h, "__qualname__", "") for e in per_step for h in ctx.handlers[e]}
    ctx.wrap_handlers(wrap, per_step)

    def step_done() -> None:  # called by the hook timer as each step's hooks end
        for name in names:
            HANDLER_S.setdefault(name, []).append(current.pop(name, 0.0))

    HANDLERS_STEP[0] = step_done


def _timed(callback: Any, hooks: tuple[str, ...], clock: Any,
           inner: tuple[Any, tuple[str, ...]] | None = None) -> Any:
    """Time every call of the callback's ``hooks`` (and all they call: every component's
    handlers), on the same clock as the steps, summed per step (``hooks[-1]`` ends a step):
    steadier than a ratio of step times on a busy machine, since no other step's noise
    enters it."""
    HOOK_S.clear()
    CALLBACK[0] = callback
    if BREAKDOWN[0]:
        _time_handlers(callback, clock)
    current = [0.0]
    each: dict[str, float] = {}  # --breakdown: this step's seconds per hook
    every = (*hooks, *(inner[1] if inner is not None else ()))
    for name in hooks:
        method = getattr(callback, name)

        def timed(*args: Any, _method: Any = method, _ends: bool = name == hooks[-1],
                  _name: str = name, **kwargs: Any) -> Any:
            started = clock()
            try:
                return _method(*args, **kwargs)
            finally:
                took = clock() - started
                current[0] += took
                each[_name] = each.get(_name, 0.0) + took
                if _ends:
                    HOOK_S.append(current[0])
                    current[0] = 0.0
                    if HANDLERS_STEP[0] is not None:
                        HANDLERS_STEP[0]()
                        for hook in every:  # the hooks' own medians (handlers included)
                            HANDLER_S.setdefault(f"hook {hook}", []).append(each.pop(hook, 0.0))
                    each.clear()
                HOOK_LEFT[0] = current[0]

        setattr(callback, name, timed)
    if inner is not None:  # called from inside the framework's step, not from a hook
        owner, names = inner
        for name in names:
            method = getattr(owner, name)

            def timed_inner(*args: Any, _method: Any = method, _name: str = name,
                            **kwargs: Any) -> Any:
                started = clock()
                try:
                    return _method(*args, **kwargs)
                finally:
                    took = clock() - started
                    current[0] += took
                    each[_name] = each.get(_name, 0.0) + took
                    HOOK_LEFT[0] = current[0]

            setattr(owner, name, timed_inner)
    return callback


LIGHTNING_HOOKS = ("on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start",
                   "on_before_backward", "on_before_optimizer_step", "on_train_batch_end")
TRANSFORMERS_HOOKS = ("on_epoch_begin", "on_epoch_end", "on_step_begin",
                      "on_pre_optimizer_step", "on_step_end")
HIDDEN = {"lightning": 64}  # the digits MLP's width (--hidden): a longer step, a smaller share


def digits_batches(steps: int) -> Any:
    """One epoch of ``steps`` shuffled batches of 32 from the digits (repeated as needed): the
    Lightning fits' data here and in ``adapters_within_fit.py``."""
    from torch.utils.data import DataLoader, TensorDataset

    sys.path.insert(0, str(ROOT / "examples"))
    from lightning_digits import digits_loaders

    data = digits_loaders(32)[0].dataset
    repeat = -(-steps * 32 // len(data))
    x, y = (torch.cat([t] * repeat)[:steps * 32] for t in data.tensors)
    return DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)


def _lightning_fit(with_prudent: bool, steps: int, clock: Any) -> list[float]:
    import lightning as L

    sys.path.insert(0, str(ROOT / "examples"))
    from lightning_digits import LitDigits, digits_loaders

    times: list[float] = []

    step_clock = _StepClock(times, clock)

    class StepTimes(L.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            step_clock.step_ended()

        def on_train_end(self, *args: Any) -> None:
            step_clock.train_ended()

    callbacks: list[Any] = [StepTimes()]
    if with_prudent:
        from prudent.lightning import PrudentCallback

        callbacks.append(_timed(PrudentCallback(name="bench-lightning", config={},
                                                exit_on_stop=False), LIGHTNING_HOOKS, clock))
    L.seed_everything(0, verbose=False)
    if EPOCH_STEPS[0] is None or EPOCH_STEPS[0] >= steps:  # one epoch of `steps` batches
        train = digits_batches(steps)
    elif EPOCH_STEPS[0] != len(train := digits_loaders(32)[0]):
        raise SystemExit(f"--epoch-steps {EPOCH_STEPS[0]}: the digits make epochs of "
                         f"{len(train)} steps; pass that or at least --steps")
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

    step_clock = _StepClock(times, clock)

    class StepTimes(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            step_clock.step_ended()

        def on_train_end(self, *args: Any, **kwargs: Any) -> None:
            step_clock.train_ended()

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

    step_clock = _StepClock(times, clock)

    class StepTimes(keras.callbacks.Callback):
        def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
            step_clock.step_ended()

        def on_train_end(self, *args: Any, **kwargs: Any) -> None:
            step_clock.train_ended()

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


def _fit_once(fit: Any, with_prudent: bool, steps: int, warmup: int, clock: Any
              ) -> dict[str, Any]:
    """One fit: its step times after the warm-up, the time from the last step to the loop's
    end (the epoch-end work, a save), the hook time per step, and how the prudent run ended."""
    gc.collect()  # neither arm pays for the garbage the previous fit left behind
    HOOK_S.clear()
    HANDLER_S.clear()
    HANDLERS_STEP[0] = None
    LOOP_TAIL[0] = HOOK_LEFT[0] = 0.0
    CALLBACK[0] = None
    THREADS_CPU[:] = [{}, {}]
    BLOCKED[:] = [0, 0]
    GC_FIT.update(n=0, s=0.0, on=False)
    try:
        times = fit(with_prudent, steps, clock)
    finally:
        GC_FIT["on"] = False
    stop = CALLBACK[0].run.stop_reason if CALLBACK[0] is not None else None
    first, end = THREADS_CPU
    threads_s = sum(cpu - first.get(ident, 0.0) for ident, cpu in end.items())
    return {"times": times[warmup:], "tail": LOOP_TAIL[0], "hooks": HOOK_S[warmup:],
            "hook_left": HOOK_LEFT[0], "stop": stop, "all_steps": max(1, len(times)),
            "gc": GC_FIT["n"], "gc_s": GC_FIT["s"], "threads_s": threads_s,
            "blocked": BLOCKED[1] - BLOCKED[0],
            "handlers": {k: statistics.median(v[warmup:]) for k, v in HANDLER_S.items()
                         if len(v) > warmup}}


def _round(alone: dict[str, Any], prudent: dict[str, Any]) -> dict[str, float]:
    """The two arms over the steps both trained: a monitoring rule may stop the prudent run
    early (a real stop, reported), and a shorter run must not be compared with a longer one.
    The loop mean divides the time from the warm-up's end to the loop's end (the epoch-end
    save included) by the steps: periodic work counts there, never in the median; after a
    stop it is the mean of the common steps (the stop's checkpoint left out)."""
    n = min(len(alone["times"]), len(prudent["times"]))
    full = len(prudent["times"]) == len(alone["times"]) and prudent["stop"] is None
    a, p, hooks = alone["times"][:n], prudent["times"][:n], prudent["hooks"][:n]
    a_mean = (sum(a) + (alone["tail"] if full else 0.0)) / n
    p_mean = (sum(p) + (prudent["tail"] if full else 0.0)) / n
    per_step = {f"{arm}_{key}": run[key] / run["all_steps"] for arm, run in
                (("alone", alone), ("prudent", prudent)) for key in ("gc", "gc_s", "threads_s", "blocked")}
    return {"steps": n, "alone": statistics.median(a), "prudent": statistics.median(p),
            "alone_mean": a_mean, "prudent_mean": p_mean, "hook": statistics.median(hooks),
            "hook_mean": (sum(hooks) + (prudent["hook_left"] if full else 0.0)) / n,
            **per_step, "handlers": prudent["handlers"]}


def compare(framework: str, rounds: int, steps: int, warmup: int, clock: Any) -> dict[str, Any]:
    fit = FRAMEWORKS[framework]
    got: list[dict[str, float]] = []
    stops: list[str] = []
    for i in range(rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        arms = {p: _fit_once(fit, p, steps, warmup, clock) for p in order}
        r = _round(arms[False], arms[True])
        got.append(r)
        if arms[True]["stop"] is not None:
            stops.append(f"round {i + 1}: {arms[True]['stop']} after {r['steps'] + warmup + 1} "
                         f"of {steps} steps")
        print(f"{framework} round {i + 1}/{rounds}: median step alone {r['alone'] * 1e3:.3f} ms, "
              f"with prudent {r['prudent'] * 1e3:.3f} ms, ratio {r['prudent'] / r['alone']:.3f}; "
              f"loop mean ratio {r['prudent_mean'] / r['alone_mean']:.3f}; hooks "
              f"{r['hook'] * 1e6:.0f} us" + (f"; STOPPED {stops[-1]}" if arms[True]["stop"]
                                             else ""), file=sys.stderr, flush=True)
    ratios = [r["prudent"] / r["alone"] for r in got]
    mean_ratios = [r["prudent_mean"] / r["alone_mean"] for r in got]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3

    def median(key: str, scale: float) -> float:
        return statistics.median(r[key] for r in got) * scale

    handlers = {name: statistics.median(r["handlers"].get(name, 0.0) for r in got) * 1e6
                for name in sorted({k for r in got for k in r["handlers"]})}
    return {"framework": framework, "rounds": rounds, "steps": steps, "warmup": warmup,
            "hidden": HIDDEN.get("lightning" if framework == "keras" else framework),
            "epoch_steps": (EPOCH_STEPS[0] or steps) if framework == "lightning" else steps,
            "median_step_ms_alone": median("alone", 1e3),
            "median_step_ms_prudent": median("prudent", 1e3),
            "loop_mean_ms_alone": median("alone_mean", 1e3),
            "loop_mean_ms_prudent": median("prudent_mean", 1e3),
            "callback_us_per_step": median("hook", 1e6),
            "callback_mean_us_per_step": median("hook_mean", 1e6),
            "callback_share": median("hook", 1e6) / 1e3 / median("alone", 1e3),
            "ratio_median": statistics.median(ratios), "ratio_q1": quartiles[0],
            # how far the headline could move with as many rounds again: on a shared 2-core
            # machine often wider than the 3% the target is about
            "ratio_ci90": _bootstrap_ci(ratios) if len(ratios) > 1 else [ratios[0]] * 2,
            "ratio_q3": quartiles[2], "ratios": ratios,
            "loop_mean_ratio": statistics.median(mean_ratios), "loop_mean_ratios": mean_ratios,
            "prudent_stopped": stops, "target": 1.03,
            # where the step's growth goes: the hooks, and what is left (the framework's own
            # code running slower beside prudent: caches, the GIL, the collector)
            "unexplained_us_per_step": statistics.median(
                (r["prudent"] - r["alone"] - r["hook"]) for r in got) * 1e6,
            "gc_per_100_steps_alone": median("alone_gc", 100),
            "gc_per_100_steps_prudent": median("prudent_gc", 100),
            "gc_us_per_step_alone": median("alone_gc_s", 1e6),
            "gc_us_per_step_prudent": median("prudent_gc_s", 1e6),
            "other_threads_cpu_us_per_step_alone": median("alone_threads_s", 1e6),
            "other_threads_cpu_us_per_step_prudent": median("prudent_threads_s", 1e6),
            "training_thread_waits_per_step_alone": median("alone_blocked", 1),
            "training_thread_waits_per_step_prudent": median("prudent_blocked", 1),
            "handlers_us_per_step": handlers,
            "meets_target": statistics.median(ratios) <= 1.03}


def _print_growth(results: list[dict[str, Any]]) -> None:
    """Where the median step's growth goes (us per step, medians of the rounds)."""
    print(f"\n{'framework':<12}{'growth us':>10}{'hooks us':>10}{'left us':>9}"
          f"{'gc/100 steps':>14}{'gc us/step':>12}{'threads us/step':>17}{'waits/step':>12}"
          "  (alone / prudent)")
    for r in results:
        growth = (r["median_step_ms_prudent"] - r["median_step_ms_alone"]) * 1e3
        print(f"{r['framework']:<12}{growth:>10.0f}{r['callback_us_per_step']:>10.0f}"
              f"{r['unexplained_us_per_step']:>9.0f}"
              f"{r['gc_per_100_steps_alone']:>7.1f}/{r['gc_per_100_steps_prudent']:<6.1f}"
              f"{r['gc_us_per_step_alone']:>5.1f}/{r['gc_us_per_step_prudent']:<6.1f}"
              f"{r['other_threads_cpu_us_per_step_alone']:>8.1f}/"
              f"{r['other_threads_cpu_us_per_step_prudent']:<8.1f}"
              f"{r['training_thread_waits_per_step_alone']:>5.2f}/"
              f"{r['training_thread_waits_per_step_prudent']:<5.2f}")
        for name, us in sorted(r["handlers_us_per_step"].items(), key=lambda kv: -kv[1]):
            print(f"    {name:<40}{us:>7.1f} us/step (median)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=[*FRAMEWORKS, "all"], default="all")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--hidden", type=int, default=64,
                        help="the Lightning and Keras digits MLPs' width")
    parser.add_argument("--epoch-steps", type=int, default=None,
                        help="Lightning: the digits' own epochs (45 steps, a checkpoint at each "
                        "end) instead of one epoch of --steps batches")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time each component handler and each hook in the prudent "
                        "arm (about a microsecond a handler call more there)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    BREAKDOWN[0] = args.breakdown
    HIDDEN["lightning"] = args.hidden
    EPOCH_STEPS[0] = args.epoch_steps
    load = os.getloadavg()
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    torch.set_num_threads(1)
    names = list(FRAMEWORKS) if args.framework == "all" else [args.framework]
    gc.callbacks.append(_gc_timer)
    with tempfile.TemporaryDirectory() as home:
        os.environ.update(PRUDENT_HOME=home, PRUDENT_CONSOLE="off")
        results = [compare(n, args.rounds, args.steps, args.warmup, clock) for n in names]
    gc.callbacks.remove(_gc_timer)
    load = (*load, *os.getloadavg())
    print(f"{'framework':<12}{'alone ms':>10}{'prudent ms':>12}{'ratio':>8}{'q1-q3':>14}"
          f"{'mean ratio':>12}{'hooks us':>10}{'(mean)':>8}{'share':>8}  target (ratio <= 1.03)"
          "  ratio 90% CI")
    for r in results:
        print(f"{r['framework']:<12}{r['median_step_ms_alone']:>10.3f}"
              f"{r['median_step_ms_prudent']:>12.3f}{r['ratio_median']:>8.3f}"
              f"{r['ratio_q1']:>7.3f}-{r['ratio_q3']:.3f}{r['loop_mean_ratio']:>12.3f}"
              f"{r['callback_us_per_step']:>10.1f}{r['callback_mean_us_per_step']:>8.1f}"
              f"{r['callback_share']:>8.1%}  {'met' if r['meets_target'] else 'MISSED':<23}"
              f"{r['ratio_ci90'][0]:.3f}-{r['ratio_ci90'][1]:.3f}")
    _print_growth(results)
    for r in results:
        for stop in r["prudent_stopped"]:
            print(f"{r['framework']}: the prudent run was stopped ({stop}): those rounds compare "
                  "the steps both arms trained")
    print(f"load average {load[0]:.2f} at the start, {load[3]:.2f} at the end "
          f"({os.cpu_count()} CPUs): above ~0.5 the ratios are the other processes' noise")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                    "clock": args.clock, "torch": torch.__version__,
                                    "cpus": os.cpu_count(), "load_average": load,
                                    "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
