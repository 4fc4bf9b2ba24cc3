"""Train N steps slowly, printing each 10th step, so a test can take the store away meanwhile.

Usage: store_outage_train.py N
"""

import sys
import time

import torch

import prudent

num_steps = int(sys.argv[1])
run = prudent.init(name="outage")
weight = torch.zeros(1, requires_grad=True)
with run:
    for step in range(num_steps):
        loss = (weight - 1).pow(2).sum()
        run.backward(loss)
        run.step(loss=loss)
        if step % 10 == 0:
            print(f"STEP {step}", flush=True)
        time.sleep(0.02)
