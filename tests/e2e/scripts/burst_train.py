"""A healthy MLP run (672 steps) whose batches BURST_ONSET.. BURST_ONSET + BURST_LENGTH - 1 of the
data arrive with their inputs scaled BURST_SCALE times (a bad shard; none with MONITOR_HEALTHY=1,
benchmarks/monitor.py's reference); logs val_loss and val_acc
each epoch and writes the final model and optimizer to final.pt. BURST_KILL_AT=N sends the
process a real SIGTERM once step N is done (a preemption at a step of the test's choosing);
run again with the same PRUDENT_RUN_ID it resumes."""

import os
import signal

import torch
from _monitor_task import HEALTHY, accuracy, blobs, evaluate, loaders, mlp, train

import prudent

ONSET = int(os.environ.get("BURST_ONSET", "300"))
LENGTH = int(os.environ.get("BURST_LENGTH", "3"))
SCALE = float(os.environ.get("BURST_SCALE", "50"))
KILL_AT = int(os.environ.get("BURST_KILL_AT", "0"))

run = prudent.init(name="burst", config={"lr": 0.05, "epochs": 6})
x, y = blobs(n=3584 + 512)
train_loader, val_loader = loaders(x, y)


def drawn() -> int:
    """The batch just drawn, numbered over the run from 1: its place in the data, whatever step
    it lands on (a rollback's skipped batches count; a resumed run goes on where it was). The
    loader itself goes to run.batches, which restores its shuffling on a resume."""
    state = run.state
    return (state.epoch * len(train_loader) + state.batches_in_epoch
            + state.epoch_samples_before // train_loader.batch_size)


def spoil(step, batch):
    x, y = batch
    return (x * SCALE, y) if ONSET <= drawn() < ONSET + LENGTH and not HEALTHY else (x, y)


def kill(step, loss):
    if step == KILL_AT:
        os.kill(os.getpid(), signal.SIGTERM)


def metrics(model, loader):
    return {**evaluate(model, loader), **accuracy(model, loader)}


model = mlp()
opt = torch.optim.SGD(model.parameters(), lr=run.config["lr"], momentum=0.9)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, run.config["epochs"] * len(train_loader))
train(run, model, opt, train_loader, run.config["epochs"], val_loader=val_loader,
      sched=sched, sched_per_step=True, before_step=spoil, after_step=kill, onset=ONSET,
      evaluate_fn=metrics)
torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, "final.pt")
