"""nanoGPT's habit: the device comes from the script's own config (`device = 'cuda'`), not from
run.device; on a machine without CUDA it cannot run at all."""

import torch

import prudent

run = prudent.init(name="cuda-script", config={"device": "cuda"})
device = run.config["device"]
model = torch.nn.Linear(4, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run.attach(model=model, optimizer=opt)
with run:
    for it in run.steps(20):
        x = torch.randn(8, 4, device=device)
        loss = model(x).pow(2).mean()
        run.backward(loss)
        opt.step()
        opt.zero_grad()
        run.step(loss=loss)
