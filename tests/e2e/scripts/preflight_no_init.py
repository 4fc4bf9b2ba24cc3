"""A plain training script that never calls prudent.init(): preflight must say so plainly."""

import torch
import torch.nn.functional as F
from preflight_common import digits_loaders, mlp

torch.manual_seed(0)
train_loader, _ = digits_loaders(32)
model = mlp()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
for epoch in range(2):
    for x, y in train_loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
print("done")
