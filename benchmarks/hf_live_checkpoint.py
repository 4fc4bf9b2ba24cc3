"""What a prudent checkpoint costs the Hugging Face Trainer's training thread with the callback.

Between the Trainer's own saves, prudent's checkpoint carries the live state (weights, AdamW's
state, the LR scheduler: ``live/`` in the checkpoint) so that a rollback or early stopping's
``restore_best`` gets the weights of the checkpoint's step. This times prudent's whole save on
the training thread (``Checkpointer.save``: the live state's tensors copied into host buffers;
the safetensors and ``torch.save`` bytes are made by the checkpoint writer's thread) in a real
``Trainer.train`` with a checkpoint every 5 steps, for a 2-layer BERT of the example's size and
a wider one; thread CPU time (what the load of other processes does not inflate) and wall time.

    python benchmarks/hf_live_checkpoint.py            # writes benchmarks/results/hf_live_checkpoint.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from prudent.checkpoint.manager import Checkpointer
from prudent.testing import make_settings
from prudent.transformers import PrudentCallback

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "hf_live_checkpoint.json"
VOCAB, LENGTH = 64, 16
SIZES = ((32, 2), (256, 4))  # hidden size, layers: the example's BERT, a 2.2 M parameter one
TIMES: list[tuple[float, float]] = []


class Sequences(torch.utils.data.Dataset):
    def __init__(self, num: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(8, VOCAB, (num, LENGTH), generator=generator)
        self.labels = torch.randint(0, 2, (num,), generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _timed(original: Any) -> Any:
    def save(self: Checkpointer, *args: Any, **kwargs: Any) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return original(self, *args, **kwargs)
        finally:
            TIMES.append((time.perf_counter() - wall, time.thread_time() - cpu))

    return save


def measure(hidden: int, layers: int, steps: int) -> dict[str, Any]:
    TIMES.clear()
    home = Path(tempfile.mkdtemp())
    cb = PrudentCallback("live-checkpoint", {}, exit_on_stop=False, settings=make_settings(
        home, checkpoint={"every": "5steps", "at_epoch_end": False}))
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=2 * hidden, max_position_embeddings=LENGTH, num_labels=2))
    args = transformers.TrainingArguments(
        output_dir=str(home / "out"), max_steps=steps, per_device_train_batch_size=8,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
        logging_steps=10**6)
    transformers.Trainer(model=model, args=args, train_dataset=Sequences(256),
                         callbacks=[cb]).train()
    saved = [e["payload"] for e in cb.adapter.ctx.store.events(cb.run.id)
             if (e["kind"], e["name"]) == ("checkpoint", "saved")]
    return {"hidden": hidden, "layers": layers,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "saves": len(TIMES), "checkpoint_mb": statistics.median(s["bytes"] for s in saved) / 1e6,
            "cpu_ms": statistics.median(t[1] for t in TIMES) * 1e3,
            "wall_ms": statistics.median(t[0] for t in TIMES) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per model")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)  # two intra-op threads on a shared 2-core machine spin
    Checkpointer.save = _timed(Checkpointer.save)  # type: ignore[method-assign]
    rows = [measure(hidden, layers, args.steps) for hidden, layers in SIZES]
    print(f"{'model':>22} {'params':>8} {'saves':>5} {'ckpt MB':>8} {'CPU ms':>7} {'wall ms':>8}")
    for r in rows:
        print(f"{r['hidden']:>8} wide x {r['layers']} layers {r['params_m']:>7.2f}M "
              f"{r['saves']:>5} {r['checkpoint_mb']:>8.2f} {r['cpu_ms']:>7.1f} {r['wall_ms']:>8.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                    "steps": args.steps, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
