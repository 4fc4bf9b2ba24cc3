"""nanoGPT's train.py loop as Karpathy wrote it, on a tiny model: the next batch is drawn
right after the forward pass (a prefetch: the batch the next iteration trains on lives in
`X, Y` across `run.step()`), the evaluation at the top of an iteration draws its batches from
the global generator, and dropout is on. prudent's lines: `run.carry` around the two
`get_batch('train')` calls and `best_val_loss` (kept across iterations); early stopping keeps
each new best evaluation's checkpoint from inside `run.log`. `die_at` SIGKILLs the process at
that iteration once (a vanished machine; a `died` file marks it); `out` writes the final
weights and `best_val_loss`. `draws` picks the generator get_batch draws its offsets from:
torch's (nanoGPT's), NumPy's or Python's global one."""

import os
import random
import signal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import prudent

run = prudent.init(name="prefetch", config={
    "max_iters": 60, "eval_interval": 10, "eval_iters": 3, "batch_size": 8, "block_size": 16,
    "lr": 3e-2, "dropout": 0.2, "die_at": 0, "out": "final.pt", "draws": "torch"})
cfg = run.config
out = cfg["out"]
torch.manual_seed(1337)
np.random.seed(1337)
random.seed(1337)
noise = torch.rand(4000, generator=torch.Generator().manual_seed(0)) < 0.2
data = torch.zeros(4000, dtype=torch.long)
for i in range(1, 4000):  # a bigram chain to learn (each token mostly decides the next)
    data[i] = 0 if noise[i] else (data[i - 1] * 7 + 3) % 27
train_data, val_data = data[:3600], data[3600:]


def get_batch(split):
    source = train_data if split == "train" else val_data
    high, size = len(source) - cfg["block_size"], cfg["batch_size"]
    if cfg["draws"] == "numpy":
        ix = np.random.randint(high, size=size).tolist()
    elif cfg["draws"] == "python":
        ix = [random.randrange(high) for _ in range(size)]
    else:
        ix = torch.randint(high, (size,))
    x = torch.stack([source[i:i + cfg["block_size"]] for i in ix])
    y = torch.stack([source[i + 1:i + 1 + cfg["block_size"]] for i in ix])
    return x, y


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(27, 32)
        self.drop = nn.Dropout(cfg["dropout"])
        self.head = nn.Linear(32, 27)

    def forward(self, x, y):
        logits = self.head(self.drop(self.embed(x)))
        return F.cross_entropy(logits.view(-1, 27), y.view(-1))


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = [model(*get_batch("val")).item() for _ in range(cfg["eval_iters"])]
    model.train()
    return sum(losses) / len(losses)


model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
run.attach(model=model, optimizer=optimizer)
X, Y = run.carry(get_batch("train"))  # fetch the very first batch
best_val_loss = run.carry(1e9, "best_val_loss")  # nanoGPT keeps it across iterations
with run:
    for iter_num in run.steps(cfg["max_iters"]):
        if iter_num % cfg["eval_interval"] == 0:
            val_loss = estimate_loss()
            run.log(val_loss=val_loss)
            if val_loss < best_val_loss:
                best_val_loss = run.carry(val_loss, "best_val_loss")
        if cfg["die_at"] and iter_num == cfg["die_at"] and not os.path.exists("died"):
            open("died", "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        loss = model(X, Y)
        X, Y = run.carry(get_batch("train"))  # prefetch the next batch
        run.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        run.step(loss=loss)
torch.save({**model.state_dict(), "best_val_loss": torch.tensor(best_val_loss)}, out)
