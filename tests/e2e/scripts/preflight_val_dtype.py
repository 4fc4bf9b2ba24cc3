"""Bug: the validation set keeps numpy's float64 while training data was made float32."""

import torch
from preflight_common import CONFIG, accuracy, digits_arrays, loaders, mlp, train_epoch

import prudent

run = prudent.init(name="val-dtype", config=CONFIG)
torch.manual_seed(run.config["seed"])
images, labels = digits_arrays()
x_train, y_train = torch.tensor(images[:1437], dtype=torch.float32), torch.tensor(labels[:1437])
x_val, y_val = torch.from_numpy(images[1437:]), torch.from_numpy(labels[1437:])  # the bug
train_loader, val_loader = loaders((x_train, y_train), (x_val, y_val), run.config["batch_size"])
model = mlp()
opt = torch.optim.AdamW(model.parameters(), lr=run.config["lr"])
run.attach(model=model, optimizer=opt)
with run:
    for epoch in run.epochs(run.config["epochs"]):
        train_epoch(run, model, opt, train_loader)
        run.log(val_acc=accuracy(model, val_loader))
