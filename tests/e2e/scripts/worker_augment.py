"""Random augmentation drawn in DataLoader workers (torchvision's reference script with its
default ``--workers 16``): a plain shuffled DataLoader with 2 workers whose dataset crops at
random on each worker's own generator, which the DataLoader seeds once per epoch.
``term_at``: the process sends itself SIGTERM once, after that step. The final model is
written to ``out``.
"""

import os
import signal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import prudent

torch.set_num_threads(1)
run = prudent.init(name="worker-augment", config={"epochs": 2, "workers": 2, "term_at": 0,
                                                  "out": "final.pt"})
cfg = run.config
term_at, out = cfg["term_at"], cfg["out"]
torch.manual_seed(0)
images = torch.randn(64, 3, 10, 10)


class Cropped(Dataset):
    def __len__(self):
        return len(images)

    def __getitem__(self, i):
        y0, x0 = torch.randint(0, 3, (2,)).tolist()  # the worker's generator
        return images[i, :, y0:y0 + 8, x0:x0 + 8], i % 4


loader = DataLoader(Cropped(), batch_size=8, shuffle=True, num_workers=cfg["workers"])
model = nn.Sequential(nn.Flatten(), nn.Linear(192, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(cfg["epochs"]):
        for x, y in run.batches(loader):
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
            opt.step()
            opt.zero_grad()
            run.step(loss=loss)
            if run.state.step == term_at and not os.path.exists("termed"):
                open("termed", "w").close()
                os.kill(os.getpid(), signal.SIGTERM)
torch.save(model.state_dict(), out)
