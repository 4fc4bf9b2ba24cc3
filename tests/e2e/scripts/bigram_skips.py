"""An iteration loop whose updates loss_spike skips: a character bigram on a repeating text
(`run.steps`, no DataLoader, batches drawn from a generator of its own, 2 micro-steps, AdamW).
The loss settles near 0.49 and a few batches land far above it, so the default monitor skips
their updates (about 8 in 600 steps). `kill_at_step` makes the process vanish (SIGKILL, as a
reclaimed machine) as that step ends; `sleep_s` slows each step; `out` is where the final
weights go. Each step appends "<pid> <step>" to steps.log.
"""

import os
import signal
import time

import torch

import prudent

run = prudent.init(name="bigram", config={"iters": 600, "accum": 2, "kill_at_step": -1,
                                          "sleep_s": 0.0, "out": "final.pt"})
cfg = run.config
out = cfg["out"]  # read with the others, not only once training is over
torch.manual_seed(0)
text = torch.tensor(list(("the quick brown fox jumps over the lazy dog " * 200).encode()))
generator = torch.Generator().manual_seed(0)
model = torch.nn.Embedding(256, 256)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
run.attach(model=model, optimizer=optimizer, batches=generator)
with run:
    for step in run.steps(cfg["iters"]):
        for _ in range(cfg["accum"]):
            ix = torch.randint(len(text) - 1, (32,), generator=generator)
            loss = torch.nn.functional.cross_entropy(model(text[ix]), text[ix + 1]) / cfg["accum"]
            run.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        run.step(loss=loss)
        with open("steps.log", "a") as log:
            log.write(f"{os.getpid()} {run.state.step}\n")
        time.sleep(cfg["sleep_s"])
        if run.state.step == cfg["kill_at_step"]:
            os.kill(os.getpid(), signal.SIGKILL)
torch.save(model.state_dict(), out)
