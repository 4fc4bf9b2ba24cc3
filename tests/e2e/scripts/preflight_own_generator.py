"""An iteration loop whose batches come from a torch.Generator of its own (a preflight bug).

prudent checkpoints Python's, NumPy's and torch's global generators, not this one: a resumed run
starts it again from its seed and trains on the first iterations' batches again. Preflight must
say so on the resume line (naming the batches' source, not a missing state key), and SKIP the
overfit line: rewinding the global generators cannot repeat these batches.
"""

import torch
import torch.nn.functional as F

import prudent

run = prudent.init(name="own-generator", config={"lr": 0.1, "max_iters": 100, "accum": 2})
cfg = run.config
torch.manual_seed(0)
data = torch.randn(256, 8)
targets = (data[:, 0] + data[:, 1] > 0).long()
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
run.attach(model=model, optimizer=opt)
batches = torch.Generator().manual_seed(7)  # the bug: not in the checkpoint
with run:
    for it in run.steps(cfg["max_iters"]):
        for _ in range(cfg["accum"]):
            ix = torch.randint(len(data), (16,), generator=batches)
            run.backward(F.cross_entropy(model(data[ix]), targets[ix]) / cfg["accum"])
        opt.step()
        opt.zero_grad()
        run.step()
