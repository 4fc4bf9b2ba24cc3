"""Hugging Face Trainer with prudent: a 2-layer BERT built from a config (no download) learns
whether a token sequence holds the marker token, on sequences generated here.

    python examples/transformers_tiny_bert.py
    prudent run --max-restarts 3 -- python examples/transformers_tiny_bert.py
    prudent run --set learning_rate=0.001 -- python examples/transformers_tiny_bert.py
    prudent preflight -- python examples/transformers_tiny_bert.py

The prudent lines are marked ``# prudent``.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from prudent.transformers import PrudentCallback

VOCAB, LENGTH, MARKER = 64, 16, 7


class MarkerSequences(Dataset):
    """Random token sequences; the label says whether MARKER occurs in the sequence."""

    def __init__(self, num: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(8, VOCAB, (num, LENGTH), generator=generator)
        marked = torch.rand(num, generator=generator) < 0.5
        where = torch.randint(0, LENGTH, (num,), generator=generator)
        self.ids[marked, where[marked]] = MARKER
        self.labels = marked.long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long),
                "labels": self.labels[i]}


def accuracy(prediction: object) -> dict[str, float]:
    logits, labels = prediction.predictions, prediction.label_ids  # type: ignore[attr-defined]
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


def main() -> None:
    prudent_cb = PrudentCallback(name="tiny-bert", config={  # prudent
        "learning_rate": 2e-3, "num_train_epochs": 3, "per_device_train_batch_size": 32,
        "seed": 0})
    cfg = prudent_cb.config  # prudent: the hyperparameters after --set or the tuner
    torch.manual_seed(cfg["seed"])
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=LENGTH, num_labels=2))
    args = TrainingArguments(output_dir="tiny-bert-out", eval_strategy="epoch",
                             save_strategy="no", logging_steps=10, report_to="none",
                             use_cpu=True, disable_tqdm=True, **cfg)
    trainer = Trainer(model=model, args=args, train_dataset=MarkerSequences(512, 0),
                      eval_dataset=MarkerSequences(128, 1), compute_metrics=accuracy,
                      callbacks=[prudent_cb])  # prudent
    trainer.train(resume_from_checkpoint=prudent_cb.resume_path())  # prudent
    print(f"final eval accuracy {trainer.state.log_history[-2]['eval_accuracy']:.3f}")


if __name__ == "__main__":
    main()
