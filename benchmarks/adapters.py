"""What an adapter callback adds to a framework's step: the framework alone against the
framework with prudent's callback (and so every default component), interleaved in one run.

Each round trains the same model on the same data twice, once per arm, in alternating order
(A B, B A, ...); a minimal timing callback, present in both arms, times every optimizer step
from one ``on_train_batch_end`` to the next (the data wait included, as a user sees it). The
first ``--warmup`` steps of each fit are dropped. Per round the two arms' median steps give a
ratio; the report is the median of those ratios with their quartiles (target: <= 1.03). The
prudent arm runs as a user's would: its own run in a throwaway home, default settings with
the console off (checkpoints on their automatic schedule, the monitor, profiler, cost meter).

On a machine other processes keep busy, ``--clock cpu`` times steps by the training thread's
CPU time (``time.thread_time``) instead of the wall clock.

Reproduce::

    python benchmarks/adapters.py                      # each framework, 6 rounds x 150 steps
    python benchmarks/adapters.py --rounds 10 --steps 300 --clock cpu
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

        callbacks.append(PrudentCallback(name="bench-lightning", config={}))
    L.seed_everything(0, verbose=False)
    train, _ = digits_loaders(32)
    trainer = L.Trainer(max_steps=steps, callbacks=callbacks, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(LitDigits(lr=0.05, hidden=64), train)
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

        callbacks.append(PrudentCallback(name="bench-transformers", config={}))
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=LENGTH, num_labels=2))
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=steps, save_strategy="no",
                                 report_to="none", use_cpu=True, disable_tqdm=True,
                                 per_device_train_batch_size=32, logging_steps=10**6)
        Trainer(model=model, args=args, train_dataset=MarkerSequences(steps * 32, 0),
                callbacks=callbacks).train()
    return times


FRAMEWORKS = {"lightning": _lightning_fit, "transformers": _transformers_fit}


def compare(framework: str, rounds: int, steps: int, warmup: int, clock: Any) -> dict[str, Any]:
    fit = FRAMEWORKS[framework]
    ratios, medians = [], {"alone": [], "prudent": []}
    for i in range(rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        round_medians = {}
        for with_prudent in order:
            times = fit(with_prudent, steps, clock)[warmup:]
            round_medians[with_prudent] = statistics.median(times)
        ratios.append(round_medians[True] / round_medians[False])
        medians["alone"].append(round_medians[False] * 1e3)
        medians["prudent"].append(round_medians[True] * 1e3)
        print(f"{framework} round {i + 1}/{rounds}: alone {round_medians[False] * 1e3:.3f} ms, "
              f"with prudent {round_medians[True] * 1e3:.3f} ms, ratio {ratios[-1]:.3f}",
              file=sys.stderr, flush=True)
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"framework": framework, "rounds": rounds, "steps": steps, "warmup": warmup,
            "median_step_ms_alone": statistics.median(medians["alone"]),
            "median_step_ms_prudent": statistics.median(medians["prudent"]),
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
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    torch.set_num_threads(1)
    names = list(FRAMEWORKS) if args.framework == "all" else [args.framework]
    with tempfile.TemporaryDirectory() as home:
        os.environ.update(PRUDENT_HOME=home, PRUDENT_CONSOLE="off")
        results = [compare(n, args.rounds, args.steps, args.warmup, clock) for n in names]
    print(f"{'framework':<12}{'alone ms':>10}{'prudent ms':>12}{'ratio':>8}{'q1-q3':>14}  target")
    for r in results:
        print(f"{r['framework']:<12}{r['median_step_ms_alone']:>10.3f}"
              f"{r['median_step_ms_prudent']:>12.3f}{r['ratio_median']:>8.3f}"
              f"{r['ratio_q1']:>7.3f}-{r['ratio_q3']:.3f}  {'met' if r['meets_target'] else 'MISSED'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                    "clock": args.clock, "torch": torch.__version__,
                                    "cpus": os.cpu_count(), "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
