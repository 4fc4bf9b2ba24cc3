"""Log N step metrics as fast as possible (store concurrency test). Usage: log_many.py N."""

import sys

import prudent

num_steps = int(sys.argv[1])
run = prudent.init(name="log-many")
with run:
    for step in range(num_steps):
        run.step(value=float(step))
