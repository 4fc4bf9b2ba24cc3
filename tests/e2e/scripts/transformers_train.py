"""examples/transformers_tiny_bert.py's model and data with the knobs the adapter's e2e tests
need: `nan_at_step` turns one step's embeddings to NaN, `sleep_s` slows each step so a test
can signal it mid-epoch, `kill_at_step` makes the process vanish (SIGKILL, as a reclaimed
machine) as that step ends, `out` is where the final weights go. Each optimizer step appends
"<pid> <step>" to steps.log.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

sys.path.insert(0, str(Path(__file__).parents[3] / "examples"))
from transformers_tiny_bert import LENGTH, VOCAB, MarkerSequences, accuracy  # noqa: E402

from prudent.transformers import PrudentCallback  # noqa: E402

torch.set_num_threads(1)
cb = PrudentCallback(name="transformers-train", config={
    "learning_rate": 2e-3, "num_train_epochs": 2, "per_device_train_batch_size": 32, "seed": 0,
    "nan_at_step": -1, "sleep_s": 0.0, "kill_at_step": -1, "out": "final.pt",
    "report_to": "none"})
cfg = cb.config
out = cfg["out"]  # read with the others, not only once training is over
torch.manual_seed(0)
model = BertForSequenceClassification(BertConfig(
    vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=32, max_position_embeddings=LENGTH, num_labels=2))


class Knobs(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        knobs.poison = state.global_step + 1 == cfg["nan_at_step"]

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(cfg["sleep_s"])
        with open("steps.log", "a") as log:
            log.write(f"{os.getpid()} {state.global_step}\n")
        if state.global_step == cfg["kill_at_step"]:
            os.kill(os.getpid(), signal.SIGKILL)


knobs = Knobs()
knobs.poison = False
model.bert.embeddings.register_forward_hook(
    lambda module, inputs, output: output * float("nan") if knobs.poison else None)
names = ("learning_rate", "num_train_epochs", "per_device_train_batch_size", "seed")
args = TrainingArguments(output_dir="hf-out", eval_strategy="epoch", save_strategy="no",
                         logging_steps=5, report_to=cfg["report_to"], use_cpu=True,
                         disable_tqdm=True,
                         **{k: cfg[k] for k in names})
trainer = Trainer(model=model, args=args, train_dataset=MarkerSequences(256, 0),
                  eval_dataset=MarkerSequences(64, 1), compute_metrics=accuracy,
                  callbacks=[cb, knobs])
trainer.train(resume_from_checkpoint=cb.resume_path())
torch.save({k: v.clone() for k, v in model.state_dict().items()}, out)
print(f"DONE {trainer.state.global_step}")
