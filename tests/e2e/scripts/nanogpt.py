"""A nanoGPT-style training script: a small character-level GPT, written as people write them.

What makes it nanoGPT-like, and unlike the other e2e scripts: an iteration counter up to
`max_iters` (no epochs), batches drawn with `torch.randint` from one tensor (no DataLoader),
a learning rate set by hand every iteration (linear warm-up, then cosine decay to lr/10),
gradient accumulation over `accum` micro-steps with clipping, and an evaluation every
`eval_interval` iterations (and once at the end) logged as `val_loss`.

The text is made here (no download): sentences of a tiny grammar drawn with a seeded
generator, so training and validation text share one distribution and the loss keeps falling.
Evaluation batches come from their own generator, seeded the same at every evaluation, so
each `val_loss` is measured on the same batches (what a pruner compares). Training batches use
the global torch generator, as nanoGPT does. `threads` 0 keeps torch's default (which honours
OMP_NUM_THREADS); `out` writes the final weights.
"""

import math
import random
import time

import torch
import torch.nn.functional as F
from torch import nn

import prudent

run = prudent.init(name="nanogpt", config={
    "lr": 1e-2, "min_lr_ratio": 0.1, "warmup_iters": 10, "max_iters": 200, "eval_interval": 20,
    "eval_iters": 4, "batch_size": 16, "block_size": 32, "accum": 2, "grad_clip": 1.0,
    "weight_decay": 0.1, "n_layer": 2, "n_head": 2, "n_embd": 32, "seed": 1337, "threads": 0,
    "sleep_s": 0.0, "out": "", "own_counter": False})
cfg = run.config
out = cfg["out"]  # read with the others, not only once training is over
if cfg["threads"]:
    torch.set_num_threads(cfg["threads"])


def make_text(num_sentences: int = 3000) -> str:
    rng = random.Random(0)
    subjects = ["the cat", "a dog", "the bird", "my friend", "the model", "a robot", "her sister"]
    verbs = ["sees", "likes", "eats", "finds", "trains", "chases", "writes"]
    objects = ["the ball", "a fish", "the data", "some bread", "the moon", "a letter", "the loss"]
    endings = ["", " quickly", " slowly", " today", " again", " at night"]
    return "".join(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}"
                   f"{rng.choice(endings)}. " for _ in range(num_sentences))


text = make_text()
chars = sorted(set(text))
data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
split = int(0.9 * len(data))
train_data, val_data = data[:split], data[split:]


def get_batch(source: torch.Tensor, generator: torch.Generator | None = None):
    block = cfg["block_size"]
    ix = torch.randint(len(source) - block - 1, (cfg["batch_size"],), generator=generator)
    x = torch.stack([source[i:i + block] for i in ix])
    y = torch.stack([source[i + 1:i + 1 + block] for i in ix])
    return x, y


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        n_embd = cfg["n_embd"]
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(cfg["block_size"], n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, cfg["n_head"]) for _ in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def get_lr(it: int) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio * lr at max_iters."""
    lr, warmup, total = cfg["lr"], cfg["warmup_iters"], cfg["max_iters"]
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    progress = min(1.0, (it - warmup) / max(1, total - warmup))
    min_lr = lr * cfg["min_lr_ratio"]
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


@torch.no_grad()
def estimate_loss() -> float:
    model.eval()
    generator = torch.Generator().manual_seed(1234)
    losses = [model(*get_batch(val_data, generator)).item() for _ in range(cfg["eval_iters"])]
    model.train()
    return sum(losses) / len(losses)


torch.manual_seed(cfg["seed"])
model = GPT(len(chars))
opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.95),
                        weight_decay=cfg["weight_decay"])
run.attach(model=model, optimizer=opt)
accum = cfg["accum"]
with run:
    # own_counter: the loop as many scripts write it, counting for itself (preflight must still
    # end its smoke run); it starts at run.state.step so that a resumed run goes on
    for it in (range(run.state.step, cfg["max_iters"]) if cfg["own_counter"]
               else run.steps(cfg["max_iters"])):
        lr = get_lr(it)
        for group in opt.param_groups:
            group["lr"] = lr
        if it % cfg["eval_interval"] == 0:
            run.log(val_loss=estimate_loss())
        step_loss = torch.zeros(())
        for _ in range(accum):
            x, y = get_batch(train_data)
            loss = model(x, y)
            run.backward(loss / accum)
            step_loss += loss.detach() / accum
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        run.step(loss=step_loss)
        if cfg["sleep_s"]:
            time.sleep(cfg["sleep_s"])  # e2e tests: time to kill it mid-run
    run.log(val_loss=estimate_loss())
if out:
    torch.save(model.state_dict(), out)
