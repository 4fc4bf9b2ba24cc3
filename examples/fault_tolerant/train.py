"""Replica groups that outlive each other (torchft): an MLP on scikit-learn's 8x8 digits.

    pip install 'prudent[ft,examples]'
    torchft_lighthouse --min_replicas 1 --join_timeout_ms 1000 --heartbeat_timeout_ms 1000 &
    export TORCHFT_LIGHTHOUSE=http://localhost:29510 RUST_LOG=warn   # torchft logs every step
    REPLICA_GROUP_ID=0 PRUDENT_RUN_ID=digits-ft-replica0 python examples/fault_tolerant/train.py &
    REPLICA_GROUP_ID=1 PRUDENT_RUN_ID=digits-ft-replica1 python examples/fault_tolerant/train.py &

Each process is a replica group (a machine, in a real job) and its own prudent run. Kill one
(``kill -9``): the other goes on about a heartbeat timeout later, without a restart. Start it
again with the same command: it takes the live group's weights, optimizer and step (not a
checkpoint's) and the two train on together; ``prudent show digits-ft-replica0`` lists who
left and joined. The ``weights_sum`` each group logs at every evaluation is the same number
in both: one model, two replicas.

The data follows the step, not a loader's position: at step ``s`` group ``g`` trains on batch
``s * replica_groups + g`` of a stream of shuffled epochs, so a group that joins at the job's
step draws the right batches (a dead group's batches of the steps it missed are not trained).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import prudent
from prudent.fault_tolerant import replicate


def digits(seed: int) -> tuple[torch.Tensor, ...]:
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32) / 16.0
    y = torch.tensor(labels, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    train, val = order[:1437], order[1437:]  # 80 / 20
    return x[train], y[train], x[val], y[val]


def batch_at(x: torch.Tensor, y: torch.Tensor, index: int, batch_size: int,
             seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch ``index`` of an endless stream of epochs, each in its own shuffled order."""
    epoch, position = divmod(index, len(x) // batch_size)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed + epoch))
    take = order[position * batch_size:(position + 1) * batch_size]
    return x[take], y[take]


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    logits = model(x)
    return {"val_loss": F.cross_entropy(logits, y).item(),
            "val_acc": (logits.argmax(1) == y).float().mean().item(),
            "weights_sum": sum(p.double().sum() for p in model.parameters()).item()}


def main() -> None:
    run = prudent.init(name="digits-ft", config={
        "lr": 1e-3, "steps": 600, "batch_size": 32, "hidden": 64, "replica_groups": 2,
        "eval_every": 50, "seed": 0})
    cfg = run.config
    torch.manual_seed(cfg["seed"])  # torchft also hands the first group's weights to the others
    train_x, train_y, val_x, val_y = digits(cfg["seed"])
    model = nn.Sequential(nn.Linear(64, cfg["hidden"]), nn.ReLU(),
                          nn.Linear(cfg["hidden"], cfg["hidden"]), nn.ReLU(),
                          nn.Linear(cfg["hidden"], 10))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    run.attach(model=model, optimizer=opt)
    group = replicate(run, model, opt)  # last before the loop: the others wait for a new group
    with run:
        for _ in run.steps(cfg["steps"]):
            group.optimizer.zero_grad()  # this step's quorum; a group that joins heals here
            index = run.state.step * cfg["replica_groups"] + group.replica_group  # job's step
            x, y = batch_at(train_x, train_y, index, cfg["batch_size"], cfg["seed"])
            loss = F.cross_entropy(group.model(x), y)
            run.backward(loss)  # the gradients are averaged over the live groups
            group.optimizer.step()  # only when the live groups committed this step
            run.step(loss=loss)
            if run.state.step % cfg["eval_every"] == 0:
                run.log(**evaluate(model, val_x, val_y))
    final = evaluate(model, val_x, val_y)
    print(f"replica group {group.replica_group}: step {run.state.step}, validation accuracy "
          f"{final['val_acc']:.4f}, weights_sum {final['weights_sum']:.10f}")


if __name__ == "__main__":
    main()
