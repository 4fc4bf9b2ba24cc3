"""How long a checkpoint blocks Lightning's training thread: Lightning's own save, Lightning's
``AsyncCheckpointIO``, and prudent's, per model width, side by side in one fit.

At every ``--every``-th step's end of one ``Trainer.fit`` (the digits MLP, SGD with momentum:
a checkpoint holds the weights and one buffer per weight), one of the arms takes a checkpoint
of the same state, the arms in turn:

- *Lightning, sync*: ``trainer.save_checkpoint(path)``, what ``ModelCheckpoint`` does (the
  dict serialised and written on the training thread);
- *Lightning, AsyncCheckpointIO*: the same call through Lightning's experimental plugin, which
  clones every tensor on the training thread and writes in a thread;
- *prudent, serialised in the loop*: prudent's save with the framework's checkpoint made into
  bytes on the training thread (``FrameworkCheckpoint.state_dict``, as prudent did before the
  file was deferred), then copied to host buffers;
- *prudent*: prudent's save as it is (``Checkpointer.save``): the checkpoint dict's tensors
  copied into reused host buffers, the bytes made, written, fsynced and hashed by the writer's
  thread.

Each arm's call is timed by the wall clock and by the training thread's CPU time; a write in
flight is waited for after the timing, so no arm's background work lands in another's call.
The table is each arm's median over its saves, and its ratio to Lightning's sync save.

    python benchmarks/framework_checkpoint.py            # widths 256, 1024, 2048
    python benchmarks/framework_checkpoint.py --widths 4096 --saves 3
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
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples"))
RESULTS = ROOT / "benchmarks" / "results" / "framework_checkpoint.json"
ARMS = ("lightning_sync", "lightning_async_io", "prudent_serialised_in_loop", "prudent")


def measure(hidden: int, saves: int, every: int, folder: Path) -> dict[str, Any]:
    import lightning as L
    from adapters import digits_batches
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
    from lightning_digits import LitDigits

    from prudent.adapters.files import FrameworkCheckpoint
    from prudent.checkpoint.deferred import resolve
    from prudent.lightning import PrudentCallback
    from prudent.testing import make_settings

    callback = PrudentCallback(name="bench-framework-checkpoint", config={}, exit_on_stop=False,
                               settings=make_settings(folder / "home", console={"mode": "off"},
                                                      checkpoint={"every": "off",
                                                                  "at_epoch_end": False}))
    ctx = callback.adapter.ctx
    checkpointer = next(c for c in ctx.components if c.name == "checkpoint")
    framework: FrameworkCheckpoint = callback.adapter.framework_checkpoint
    times: dict[str, list[tuple[float, float]]] = {arm: [] for arm in ARMS}

    def take(arm: str, trainer: Any, timed: bool) -> None:
        path = folder / f"{arm}.ckpt"
        strategy = trainer.strategy
        if arm == "lightning_async_io":
            strategy.checkpoint_io = AsyncCheckpointIO(TorchCheckpointIO())
        if arm == "prudent_serialised_in_loop":
            framework.deferred_state_dict = lambda: resolve(  # type: ignore[method-assign]
                FrameworkCheckpoint.deferred_state_dict(framework))
        wall, cpu = time.perf_counter(), time.thread_time()
        if arm.startswith("lightning"):
            trainer.save_checkpoint(path, weights_only=False)
        else:
            checkpointer.save(ctx, "benchmark")
        if timed:  # the first round warms each arm up (imports, buffers, files)
            times[arm].append((time.perf_counter() - wall, time.thread_time() - cpu))
        if arm == "lightning_async_io":
            strategy.checkpoint_io.teardown()  # waits for its write
            strategy.checkpoint_io = TorchCheckpointIO()
        if arm.startswith("prudent"):
            checkpointer.writer.wait()
            vars(framework).pop("deferred_state_dict", None)

    class Saves(L.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            turn = trainer.global_step // every - 1
            if trainer.global_step % every == 0 and turn < (saves + 1) * len(ARMS):
                take(ARMS[turn % len(ARMS)], trainer, timed=turn >= len(ARMS))

    steps = every * (saves + 1) * len(ARMS)
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(max_steps=steps, callbacks=[callback, Saves()], accelerator="cpu",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    model = LitDigits(lr=0.05, hidden=hidden)
    trainer.fit(model, digits_batches(steps))
    row: dict[str, Any] = {"width": hidden,
                           "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
                           "file_mb": (folder / "lightning_sync.ckpt").stat().st_size / 1e6}
    for arm, pairs in times.items():
        row[arm] = {"wall_ms": 1e3 * statistics.median(w for w, _ in pairs),
                    "cpu_ms": 1e3 * statistics.median(c for _, c in pairs), "saves": len(pairs)}
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    print("the training thread's time per checkpoint under Lightning (median; ratio to "
          "Lightning's sync save, wall clock)")
    print("width | params | file | " + " | ".join(ARMS))
    for row in rows:
        base = row["lightning_sync"]["wall_ms"]
        cells = [f"{row[a]['wall_ms']:.1f} ms ({row[a]['wall_ms'] / base:.2f}x), "
                 f"CPU {row[a]['cpu_ms']:.1f} ms" for a in ARMS]
        print(f"{row['width']} | {row['params_m']:.2f} M | {row['file_mb']:.1f} MB | "
              + " | ".join(cells))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--saves", type=int, default=5, help="saves per arm and width")
    parser.add_argument("--every", type=int, default=4, help="steps between two saves")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # two intra-op threads on a shared 2-core machine spin
    load = os.getloadavg()
    rows = []
    for hidden in args.widths:
        with tempfile.TemporaryDirectory() as folder:
            rows.append(measure(hidden, args.saves, args.every, Path(folder)))
    print_table(rows)
    print(f"load average {load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end "
          f"({os.cpu_count()} CPUs)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
        "saves": args.saves, "every": args.every, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
