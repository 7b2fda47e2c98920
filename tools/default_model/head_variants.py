"""The experiment that chose conditioned heads: does head 1 get better when it also reads token t+1?

Three variants of head 1 on the frozen embedded model, trained the same way (STEPS x 1,024-token windows of the
training split, soft targets: the model's own distribution at t+1, AdamW 5e-3, warm-up 30, cosine), then scored
on 40 held-out windows as head_match.py scores them:
  A  plain:        h + W . RMSNorm(h)                           (the paper's block)
  B  conditioned:  h + W . RMSNorm(h) + U . RMSNorm(E[x_{t+1}])   (what `train-heads --conditioned` trains)
  C  MLP:          B + W2 . silu(W1 . [RMSNorm(h); RMSNorm(E[x_{t+1}])])   (4x B's parameters; not built)
Results of 2026-12-03 (700 steps each): BENCHMARKS.md, "Conditioned heads".

Run (one thread each; A and B side by side took ~4.5 min): `python -m tools.default_model.head_variants A 700`
"""

import json
import math
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from longswift.api import load
from longswift.model.cache import NoCache
from longswift.model.transformer import RMSNorm

torch.set_num_threads(1)
torch.manual_seed(0)

variant, steps = sys.argv[1], int(sys.argv[2])
eng = load(threads=1, heads=False)
model = eng.model.eval().requires_grad_(False)


def tok(s):
    return eng.encode(s)


EOS = 0


def stream(path, limit):
    ids = []
    for line in open(path):
        ids += tok(json.loads(line)["text"]) + [EOS]
        if len(ids) >= limit:
            break
    return torch.tensor(ids[:limit])


random.seed(0)
train = stream("build/default_model/train.jsonl", 1_600_000)
valid = stream("build/default_model/valid.jsonl", 40 * 1025)
H = model.cfg.hidden_size
emb = model.model.embed_tokens.weight  # tied with lm_head


class Head(nn.Module):
    def __init__(s, kind):
        super().__init__()
        s.kind = kind
        s.norm = RMSNorm(H, 1e-5)
        s.proj = nn.Linear(H, H, bias=False)
        s.out = RMSNorm(H, 1e-5)
        nn.init.zeros_(s.proj.weight)
        s.out.weight.data.copy_(model.model.norm.weight.float())
        if kind != "A":
            s.enorm = RMSNorm(H, 1e-5)
            s.eproj = nn.Linear(H, H, bias=False)
            nn.init.zeros_(s.eproj.weight)
        if kind == "C":
            s.up = nn.Linear(2 * H, 2 * H, bias=False)
            s.down = nn.Linear(2 * H, H, bias=False)
            nn.init.zeros_(s.down.weight)

    def forward(s, h, nxt):
        x = h + s.proj(s.norm(h))
        if s.kind != "A":
            e = s.enorm(F.embedding(nxt, emb))
            x = x + s.eproj(e)
            if s.kind == "C":
                x = x + s.down(F.silu(s.up(torch.cat([s.norm(h), e], -1))))
        return s.out(x)


head = Head(variant)
opt = torch.optim.AdamW(head.parameters(), lr=5e-3, weight_decay=0.1)
T = 1024


def batch(src, i):
    w = src[i : i + T + 1]
    return w


@torch.no_grad()
def teacher(w):
    h = model(w[None, :T], torch.arange(T), NoCache())  # (1,T,H)
    logits = model.logits(h)  # (1,T,V)
    return h[0], logits[0]


def student_logits(h, w):
    # position t (0..T-2): input h_t and x_{t+1}=w[t+1]; target teacher at position t+1
    out = head(h[:-1], w[1:T])
    return model.lm_head(out).float()


t0 = time.time()
for step in range(steps):
    lr = 5e-3 * min(1, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * step / steps))
    for g in opt.param_groups:
        g["lr"] = lr
    i = random.randrange(0, len(train) - T - 2)
    w = batch(train, i)
    h, tl = teacher(w)
    sl = student_logits(h, w)
    target = tl[1:].softmax(-1)
    loss = -(target * sl.log_softmax(-1)).sum(-1).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 100 == 0:
        print(variant, step, round(loss.item(), 3), round(time.time() - t0), flush=True)
# eval
hit_c = hit_g = n = 0
psum = top1p = 0.0
with torch.no_grad():
    for k in range(40):
        w = valid[k * 1025 : k * 1025 + T + 1]
        h, tl = teacher(w)
        sl = student_logits(h, w)
        d = sl.argmax(-1)  # draft for position t+2 (teacher position t+1)
        tt = tl[1:]
        probs = tt.softmax(-1)
        keep = probs >= 0.1 * probs.max(-1, keepdim=True).values  # min-p 0.1, temperature 1
        pm = torch.where(keep, probs, 0)
        pm = pm / pm.sum(-1, keepdim=True)
        hit_c += int((d[:-1] == w[2:T]).sum())
        hit_g += int((d == tt.argmax(-1)).sum())
        psum += pm.gather(1, d[:, None]).sum().item()
        top1p += pm.max(-1).values.sum().item()
        n += d.shape[0]
res = dict(
    variant=variant,
    steps=steps,
    train_s=round(time.time() - t0),
    acc_corpus=hit_c / n,
    acc_model_greedy=hit_g / n,
    accept_sampled=psum / n,
    bound_top1p=top1p / n,
    params=sum(p.numel() for p in head.parameters()),
)
print(json.dumps(res))
json.dump(res, open(f"build/head_variant_{variant}.json", "w"))
