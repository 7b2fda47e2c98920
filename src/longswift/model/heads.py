"""TokenSwift's draft heads: γ chained residual blocks on top of the frozen base model, sharing its LM head.

Block i computes h_i = h_{i-1} + W_i · RMSNorm_i(h_{i-1}) (no bias), starting from h_0 = the last decoder layer's
output *before* the final norm, and predicts token t+1+i through its own output RMSNorm and the base LM head.
One forward of the base model therefore yields γ+1 next-token distributions (base head + γ blocks).

Conditioned heads (`HeadsMeta.conditioned`, `train-heads --conditioned`) add to block 1 the term
U · RMSNorm(E[x_{t+1}]): the embedding of the token the base head's position is followed by. When drafting, that
token is the next root, which the verification has already decided, so block 1 no longer guesses token t+2
without knowing token t+1. Under sampling that guess is the plain heads' main loss (t+1 is a random draw): on the
embedded model the same training made block 1 match the model's own greedy choice 48% of the time against 26%
for a plain block (BENCHMARKS.md, "Conditioned heads"). The cost is one embedding row and a H x H matmul.
A token MLP (`HeadsMeta.token_mlp` = its width N, `train-heads --token-mlp N`) adds to the same block
W_down · silu(W_up · [RMSNorm(h); RMSNorm(E[x_{t+1}])]): the sum above can only add what the token says to what the
state says, while the MLP lets each change what the other means (on the embedded model, N = 2H matched the model's
greedy choice 59% of the time against 48%, in the experiment that chose conditioned heads).

Heads are saved as one small safetensors file whose header metadata carries a JSON description (γ, sizes and the
base model's fingerprint); loading them onto another model is refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..errors import HeadsError
from ..files import atomic_write
from .transformer import RMSNorm, Transformer

FORMAT = "longswift-draft-heads/1"


@dataclass(frozen=True)
class HeadsMeta:
    """What a heads file says about itself; checked against the base model before use."""

    gamma: int
    hidden_size: int
    vocab_size: int
    fingerprint: str
    rms_norm_eps: float = 1e-6
    format: str = FORMAT
    conditioned: bool = False  # block 1 also reads the embedding of the token its position is followed by
    token_mlp: int = 0  # width of block 1's MLP over its state and that token's embedding; 0 = none (conditioned only)

    def __post_init__(self) -> None:
        if self.token_mlp < 0 or (self.token_mlp and not self.conditioned):
            raise ValueError(f"token_mlp={self.token_mlp} needs conditioned heads and a width >= 1 (or 0)")


class HeadBlock(nn.Module):
    def __init__(self, hidden: int, eps: float, conditioned: bool = False, token_mlp: int = 0) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden, eps)
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.out_norm = RMSNorm(hidden, eps)
        self.token_norm: RMSNorm | None = RMSNorm(hidden, eps) if conditioned else None
        self.token_proj: nn.Linear | None = nn.Linear(hidden, hidden, bias=False) if conditioned else None
        self.mlp_up: nn.Linear | None = nn.Linear(2 * hidden, token_mlp, bias=False) if token_mlp else None
        self.mlp_down: nn.Linear | None = nn.Linear(token_mlp, hidden, bias=False) if token_mlp else None

    def forward(self, h: Tensor, following: Tensor | None) -> Tensor:
        """h (..., H) -> the block's new residual state (before its output norm); `following` as DraftHeads'."""
        state = self.norm(h)
        out = h + self.proj(state)
        if self.token_proj is None or self.token_norm is None:
            return out
        if following is None:
            raise ValueError("conditioned heads need the embedding of the token each position is followed by")
        token = self.token_norm(following.to(h.dtype))
        out = out + self.token_proj(token)
        if self.mlp_up is not None and self.mlp_down is not None:
            out = out + self.mlp_down(F.silu(self.mlp_up(torch.cat([state, token], -1))))
        return out


class DraftHeads(nn.Module):
    """γ chained blocks; `forward` returns each block's normalised output, ready for the shared LM head."""

    def __init__(self, meta: HeadsMeta) -> None:
        super().__init__()
        self.meta = meta
        self.blocks = nn.ModuleList(
            HeadBlock(meta.hidden_size, meta.rms_norm_eps, meta.conditioned and i == 0, meta.token_mlp if i == 0 else 0)
            for i in range(meta.gamma)
        )

    @classmethod
    def for_model(
        cls, model: Transformer, gamma: int, fingerprint: str, conditioned: bool = False, token_mlp: int = 0
    ) -> DraftHeads:
        """Fresh heads that start out predicting what the base head predicts (zero residual, copied final norm).

        That is a far better starting point than random: training only has to learn the shift to token t+1+i.
        The token MLP's input matrix is random (seeded: equal configs give identical heads), so that its zeroed
        output matrix gets gradients from the first step.
        """
        cfg = model.cfg
        meta = HeadsMeta(
            gamma,
            cfg.hidden_size,
            cfg.vocab_size,
            fingerprint,
            cfg.rms_norm_eps,
            conditioned=conditioned or bool(token_mlp),
            token_mlp=token_mlp,
        )
        heads = cls(meta)
        heads.to(device=model.device, dtype=torch.float32)
        with torch.no_grad():
            for block in heads.typed_blocks():
                block.proj.weight.zero_()
                block.out_norm.weight.copy_(model.model.norm.weight.float())
                if block.token_proj is not None:
                    block.token_proj.weight.zero_()
                if block.mlp_up is not None and block.mlp_down is not None:
                    seeded = torch.Generator().manual_seed(0)
                    up = torch.randn(block.mlp_up.weight.shape, generator=seeded) / math.sqrt(2 * cfg.hidden_size)
                    block.mlp_up.weight.copy_(up)
                    block.mlp_down.weight.zero_()
        return heads

    def typed_blocks(self) -> list[HeadBlock]:
        """The blocks, typed (a ModuleList yields plain Modules to the type checker)."""
        return cast("list[HeadBlock]", list(self.blocks))

    @property
    def conditioned(self) -> bool:
        return self.meta.conditioned

    def forward(self, hidden: Tensor, blocks: int | None = None, following: Tensor | None = None) -> list[Tensor]:
        """hidden (..., H) pre-final-norm -> γ tensors (..., H) (the first `blocks`, if given), normalised by each
        block's output norm. `following` (..., H): the embedding of the token each position is followed by (the
        next root when drafting); conditioned heads need it, plain heads ignore it."""
        outs = []
        h = hidden
        for block in self.typed_blocks()[:blocks]:
            h = block(h, following)
            outs.append(block.out_norm(h))
        return outs

    def logits(
        self,
        model: Transformer,
        hidden: Tensor,
        base: bool = True,
        blocks: int | None = None,
        following: Tensor | None = None,
    ) -> Tensor:
        """hidden (..., H) -> fp32 logits (γ+1, ..., V): row 0 from the base head, row i from block i.

        base=False leaves out the base head's row -> (γ, ..., V), for callers that already know its choice.
        blocks: run only the first `blocks` blocks (a tree shallower than γ reads no more rows: each row is a
        matmul with the whole LM head, the largest cost of drafting on a CPU). following (...,) token ids: the
        token each position is followed by (the root), read by conditioned heads only.
        """
        embedded = model.model.embed_tokens(following) if self.conditioned and following is not None else None
        rows = [out.to(model.dtype) for out in self(hidden.to(self.dtype), blocks, embedded)]
        if base:
            rows.insert(0, model.model.norm(hidden))
        return model.lm_head(torch.stack(rows)).float()  # one LM-head matmul for all rows

    @property
    def dtype(self) -> torch.dtype:
        return self.typed_blocks()[0].proj.weight.dtype

    def save(self, path: str | Path) -> None:
        """Write the heads (safetensors, with `meta` as metadata) so that `path` is the old file or all of the new.

        The counterpart of `load`; the file gets the usual permissions (safetensors' own writer makes it 0600).
        """
        from safetensors.torch import save

        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, save(tensors, metadata={"longswift": json.dumps(asdict(self.meta))}))

    @classmethod
    def load(
        cls, path: str | Path, fingerprint: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> DraftHeads:
        """Load heads saved by `save`; refuse them if they were trained for another base model."""
        meta, state = _read(Path(path))
        if meta.fingerprint != fingerprint:
            raise HeadsError(
                f"heads {path} were trained for another model (fingerprint {meta.fingerprint}, "
                f"this model is {fingerprint})"
            )
        heads = cls(meta)
        try:
            heads.load_state_dict(state)
        except RuntimeError:
            kind = f"token-MLP {meta.token_mlp} " if meta.token_mlp else "conditioned " if meta.conditioned else ""
            raise HeadsError(f"heads file {path} does not match its own description ({kind}γ={meta.gamma})") from None
        return heads.to(device=device, dtype=dtype).eval().requires_grad_(False)


def read_meta(path: str | Path) -> HeadsMeta:
    """The description stored in a heads file, without loading its weights into a module."""
    return _read(Path(path))[0]


def _read(path: Path) -> tuple[HeadsMeta, dict[str, Tensor]]:
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise HeadsError(f"heads file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("longswift")
            state = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise HeadsError(f"corrupt heads file {path}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
    try:
        meta = HeadsMeta(**json.loads(raw if raw is not None else "null"))
    except (TypeError, ValueError):
        raise HeadsError(f"{path} is not a longswift heads file (no valid description in its header)") from None
    if meta.format != FORMAT:
        raise HeadsError(f"{path} has heads format {meta.format!r}; this longswift reads {FORMAT!r}")
    return meta, state
