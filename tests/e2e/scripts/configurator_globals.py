"""A configurator-style script, as nanoGPT's train.py is written: the hyperparameters are module
globals, `--key=value` on the command line overrides them (nanoGPT's configurator.py), and the
config handed to prudent is built from those globals.

The loop reads the globals, never run.config: `globals().update(run.config)` after
prudent.init is what brings `prudent run --set` values into them. `--update_globals=False`
leaves that line out, so a `--set learning_rate=...` is recorded but not trained with (the
unread-config warning's case). The learning rate the optimizer used is logged as `lr_used`.
"""

import sys
from ast import literal_eval

import torch
import torch.nn.functional as F

import prudent

learning_rate = 1e-3
max_iters = 20
batch_size = 16
update_globals = True
config_keys = [k for k, v in globals().items()
               if not k.startswith("_") and isinstance(v, (int, float, bool, str))]
for arg in sys.argv[1:]:  # nanoGPT's configurator: --key=value, the type of the default
    key, _, value = arg.removeprefix("--").partition("=")
    assert key in globals() and type(literal_eval(value)) is type(globals()[key]), arg
    globals()[key] = literal_eval(value)
config = {k: globals()[k] for k in config_keys}

run = prudent.init(name="configurator", config=config)
if update_globals:
    globals().update(run.config)

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=learning_rate)
run.attach(model=model, optimizer=opt)
with run:
    for it in run.steps(max_iters):
        x = torch.randn(batch_size, 4)
        loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
        run.backward(loss)
        opt.step()
        opt.zero_grad()
        run.step(loss=loss)
    run.log(lr_used=opt.param_groups[0]["lr"])
