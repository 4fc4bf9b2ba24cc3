"""Train slowly (sleeping each step) until a signal arrives; prints READY after the first step."""

import time

import torch

import prudent

run = prudent.init(name="slow", config={"steps": 10_000})
weight = torch.zeros(1, requires_grad=True)
with run:
    for _ in run.epochs(1):
        for step in run.batches(range(run.config["steps"])):
            loss = (weight - 1).pow(2).sum()
            run.backward(loss)
            run.step(loss=loss)
            if step == 0:
                print("READY", flush=True)
            time.sleep(0.02)
