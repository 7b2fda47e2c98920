"""The authors' released TokenSwift checkpoints: a Hugging Face model directory whose weights also hold the heads.

TokenSwift-Llama-3.1-8B, TokenSwift-Qwen2.5-1.5B/7B/14B, TokenSwift-Yarn-Llama-2-7b-128k,
TokenSwift-DeepSeek-R1-Distill-Qwen-32B and TokenSwift-QwQ-32B are plain model directories whose config.json adds
`medusa_heads` (γ) and whose safetensors add, for each draft block i < γ (H = hidden size):

    model.medusa_layers.{i}.input_layernorm.weight  (H,)    -> HeadBlock.norm
    model.medusa_layers.{i}.linear.weight           (H, H)  -> HeadBlock.proj (no bias)
    model.medusa_layers.{i}.post_layernorm.weight   (H,)    -> HeadBlock.out_norm

Their block (`MedusaModel` in bigai-nlco/TokenSwift, models/modeling_*.py) computes h' = h + linear(RMSNorm(h))
with eps = config.rms_norm_eps, hands the un-normalised h' to the next block and post_layernorm(h') to the shared
LM head, and the first block reads the last decoder layer's output before the final norm. That is
`DraftHeads.forward` exactly, so the tensors are only renamed, never converted.

This module also decides which heads an engine uses: a heads file when one is given (or lies beside the model as
heads.safetensors) wins over embedded blocks, and says so; otherwise the embedded blocks, if any.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, HeadsError
from .checkpoint import EMBEDDED_HEADS_PREFIX as PREFIX
from .checkpoint import HEADS_FILE, Checkpoint
from .heads import DraftHeads, HeadsMeta

RENAMES = {
    "input_layernorm.weight": "norm.weight",
    "linear.weight": "proj.weight",
    "post_layernorm.weight": "out_norm.weight",
}
BLOCKS_FILE = "model-draft-heads.safetensors"  # the shard `write_released` adds beside the base weights


@dataclass(frozen=True)
class LoadedHeads:
    """Draft heads ready for decoding, with what identifies them to job checkpoints and to the user."""

    heads: DraftHeads
    fingerprint: str  # sha256 of the heads file, or of the embedded tensors: a resumed job must see the same
    source: str  # the heads file's path, or "embedded" for blocks stored in the model directory
    note: str | None = None  # set when a heads file overrides blocks embedded in the model directory


def load_heads(
    checkpoint: Checkpoint,
    heads: str | Path | bool | None,
    model_fingerprint: str,
    device: torch.device | str,
    dtype: torch.dtype,
) -> LoadedHeads | None:
    """heads: a heads file; True: the blocks embedded in the model directory, if any; None or False: none."""
    if heads is None or heads is False:
        return None
    if heads is True:
        return load_embedded(checkpoint, model_fingerprint, device, dtype)
    path = Path(heads)
    loaded = DraftHeads.load(path, model_fingerprint, device, dtype)
    blocks = embedded_block_count(checkpoint)
    note = f"using heads file {path}, not the {blocks} draft blocks embedded in {checkpoint.path}" if blocks else None
    return LoadedHeads(loaded, hashlib.sha256(path.read_bytes()).hexdigest()[:16], str(path), note)


def embedded_block_count(checkpoint: Checkpoint) -> int:
    """How many draft blocks the directory's weights hold (0: a plain model); reads tensor names only."""
    indices = {name[len(PREFIX) :].split(".")[0] for name in checkpoint.tensor_names() if name.startswith(PREFIX)}
    return len(indices)


def load_embedded(
    checkpoint: Checkpoint,
    model_fingerprint: str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> LoadedHeads | None:
    """The draft blocks stored in a released-format directory as `DraftHeads`, or None for a plain model."""
    stored = checkpoint.read_tensors(lambda name: name.startswith(PREFIX))
    gamma = _declared_gamma(checkpoint.raw_config)
    if not stored and gamma is None:
        return None
    cfg = checkpoint.config
    state = _block_state(stored, gamma, cfg.hidden_size, checkpoint.path)
    with torch.device("meta"):
        heads = DraftHeads(
            HeadsMeta(len(state) // len(RENAMES), cfg.hidden_size, cfg.vocab_size, model_fingerprint, cfg.rms_norm_eps)
        )
    heads.load_state_dict(state, assign=True)
    heads = heads.to(device=device, dtype=dtype).eval().requires_grad_(False)
    return LoadedHeads(heads, tensors_fingerprint(stored), "embedded")


def tensors_fingerprint(tensors: dict[str, Tensor]) -> str:
    """A stable hash of named tensors as stored (name, dtype, shape, bytes), whatever dtype they are loaded in."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _declared_gamma(raw: dict[str, Any]) -> int | None:
    value = raw.get("medusa_heads")
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HeadsError(f"config.json has medusa_heads={value!r}; expected the number of draft blocks (>= 1)")
    return value


def _block_state(stored: dict[str, Tensor], gamma: int | None, hidden: int, where: Path) -> dict[str, Tensor]:
    """Check the released tensors against config.json and the hidden size; rename them to `DraftHeads` names."""
    blocks: dict[int, dict[str, Tensor]] = {}
    for name, tensor in stored.items():
        index, _, leaf = name[len(PREFIX) :].partition(".")
        if leaf.endswith(".bias"):
            raise HeadsError(f"{name} in {where}: TokenSwift draft blocks have no bias terms")
        if not index.isdigit() or leaf not in RENAMES:
            raise HeadsError(f"unexpected tensor {name} in {where} (a draft block holds {', '.join(RENAMES)})")
        blocks.setdefault(int(index), {})[leaf] = tensor
    if gamma is None:
        raise HeadsError(
            f"weights in {where} hold {len(blocks)} draft blocks ({PREFIX}*) but config.json has no medusa_heads"
        )
    if sorted(blocks) != list(range(gamma)):
        held = ", ".join(map(str, sorted(blocks))) or "none"
        raise HeadsError(f"config.json says medusa_heads={gamma} but the weights in {where} hold draft blocks {held}")
    state: dict[str, Tensor] = {}
    for i in range(gamma):
        for leaf, ours in RENAMES.items():
            name = f"{PREFIX}{i}.{leaf}"
            if leaf not in blocks[i]:
                raise HeadsError(f"draft block {i} in {where} lacks {name}")
            want = (hidden, hidden) if leaf.startswith("linear") else (hidden,)
            if tuple(blocks[i][leaf].shape) != want:
                raise HeadsError(
                    f"{name} in {where} has shape {tuple(blocks[i][leaf].shape)}; hidden size {hidden} needs {want}"
                )
            state[f"blocks.{i}.{ours}"] = blocks[i][leaf]
    return state


def export_heads(model_dir: str | Path, out: str | Path) -> HeadsMeta:
    """Write the blocks embedded in a released-format directory as a longswift heads file (fp32, model fingerprint)."""
    checkpoint = Checkpoint.open(model_dir)
    loaded = load_embedded(checkpoint, checkpoint.fingerprint())
    if loaded is None:
        raise HeadsError(
            f"{checkpoint.path} holds no draft blocks (no medusa_heads in config.json, no {PREFIX}* tensors)"
        )
    loaded.heads.save(Path(out))
    return loaded.heads.meta


def write_released(model_dir: str | Path, heads_file: str | Path, out_dir: str | Path) -> Path:
    """Write `out_dir`: the model directory in the authors' released format, with `heads_file` as its draft blocks.

    The base weights are copied unchanged; the blocks go to one extra shard listed in model.safetensors.index.json,
    and config.json gains `medusa_heads`, so both longswift and the authors' code read the result.
    """
    checkpoint = Checkpoint.open(model_dir)
    if embedded_block_count(checkpoint):
        raise HeadsError(f"{checkpoint.path} already holds draft blocks; start from the base model directory")
    heads = DraftHeads.load(heads_file, checkpoint.fingerprint())
    if heads.meta.conditioned:
        raise HeadsError(
            f"heads {heads_file} are conditioned on the root token, which the released format has no place for; "
            "export plain heads (train-heads without --conditioned)"
        )
    if heads.meta.rms_norm_eps != checkpoint.config.rms_norm_eps:
        raise HeadsError(
            f"heads {heads_file} use RMSNorm eps {heads.meta.rms_norm_eps}, the model "
            f"{checkpoint.config.rms_norm_eps}; the released format has one eps for both"
        )
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} exists and is not an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    weight_map = _copy_model_files(checkpoint, out)
    _write_blocks(heads, out / BLOCKS_FILE, weight_map)
    total = sum((out / f).stat().st_size for f in set(weight_map.values()))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    config = {**checkpoint.raw_config, "medusa_heads": heads.meta.gamma}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out


def _copy_model_files(checkpoint: Checkpoint, out: Path) -> dict[str, str]:
    """Copy weights, tokenizer and generation config (not config.json, the index or stray heads files).

    Returns the weight map: tensor name -> shard file name.
    """
    weights = {f.name for f in checkpoint.weight_files}
    skip = {"config.json", "model.safetensors.index.json", HEADS_FILE}
    for f in checkpoint.path.iterdir():
        if f.is_file() and f.name not in skip and (f.suffix != ".safetensors" or f.name in weights):
            shutil.copy2(f, out / f.name)
    from safetensors import safe_open

    weight_map: dict[str, str] = {}
    for file in checkpoint.weight_files:
        with safe_open(str(file), framework="pt") as f:
            weight_map.update({name: file.name for name in f.keys()})
    return weight_map


def _write_blocks(heads: DraftHeads, path: Path, weight_map: dict[str, str]) -> None:
    from safetensors.torch import save_file

    ours_to_theirs = {ours: theirs for theirs, ours in RENAMES.items()}
    tensors: dict[str, Tensor] = {}
    for name, tensor in heads.state_dict().items():
        _, i, module, param = name.split(".")  # blocks.{i}.{norm|proj|out_norm}.weight
        tensors[f"{PREFIX}{i}.{ours_to_theirs[f'{module}.{param}']}"] = tensor.detach().contiguous().cpu()
    save_file(tensors, str(path), metadata={"format": "pt"})
    weight_map.update({name: path.name for name in tensors})
