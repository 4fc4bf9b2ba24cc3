"""A step that raises on one sample: a label out of range (a bug in the labelling pipeline)."""

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import prudent

torch.set_num_threads(1)
run = prudent.init(name="bad-label")
x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
y = (x[:, 0] > 0).long()
y[77] = 5  # only classes 0 and 1 exist
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True,
                    generator=torch.Generator().manual_seed(3))
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(2):
        for xb, yb in run.batches(loader):
            if (yb > 1).any():
                raise IndexError(f"label {int(yb.max())} out of range for 2 classes")
            loss = F.cross_entropy(model(xb), yb)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
