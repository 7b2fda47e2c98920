"""Read a local Hugging Face model directory: config.json, one or sharded *.safetensors, tokenizer, generation config.

Safetensors only (never pickle) and never remote code: a checkpoint is data, not a program. Every way a
directory can be broken is reported as a one-line `CheckpointError`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig
from ..errors import CheckpointError
from .transformer import Transformer

DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


@dataclass(frozen=True)
class Checkpoint:
    """A model directory that has been checked: its config and where its weights live."""

    path: Path
    config: ModelConfig
    raw_config: dict[str, Any]
    weight_files: tuple[Path, ...]

    @classmethod
    def open(cls, path: str | Path) -> Checkpoint:
        root = Path(path)
        if not root.is_dir():
            raise CheckpointError(f"model directory not found: {root}")
        raw = _read_json(root / "config.json", "config.json")
        return cls(root, ModelConfig.from_dict(raw), raw, _weight_files(root))

    def eos_token_ids(self) -> tuple[int, ...]:
        """EOS ids from generation_config.json (int or list), else config.json."""
        gen = root_json(self.path / "generation_config.json")
        ids = gen.get("eos_token_id", self.raw_config.get("eos_token_id"))
        if ids is None:
            return ()
        return tuple(int(i) for i in (ids if isinstance(ids, list) else [ids]))

    def load_model(self, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Transformer:
        """Build the model on the meta device, then assign the checkpoint's tensors (no random init, no copy)."""
        with torch.device("meta"):
            model = Transformer(self.config)
        return assign_weights(model, self.read_tensors(_is_base_weight, device, dtype), self.path, device)

    def fingerprint(self) -> str:
        """A short hash that identifies this base model to its draft heads, whatever dtype it is loaded in.

        Heads share the LM head and read the last layer's hidden states, so the architecture numbers and the
        stored LM head (the embedding when tied) are what must not change. A strided sample of rows keeps this
        cheap for 128K-vocabulary models; a retrained model differs everywhere.
        """
        from safetensors import safe_open

        cfg = self.config
        h = hashlib.sha256(
            repr(
                (cfg.architecture, cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads)
            ).encode()
        )
        name = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
        for file in self.weight_files:
            with safe_open(str(file), framework="pt") as f:
                if name in f.keys():
                    weight = f.get_tensor(name)
                    rows = weight[:: max(1, weight.shape[0] // 1024)].contiguous()
                    h.update(rows.view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:16]

    def load_tokenizer(self) -> Any:
        """The checkpoint's own tokenizer through `AutoTokenizer` (local files only, no remote code)."""
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(self.path), local_files_only=True, trust_remote_code=False)
        except Exception as exc:  # transformers raises many types (OSError, ValueError, ...) for a bad directory
            raise CheckpointError(f"cannot load the tokenizer from {self.path}: {_first_line(exc)}") from None

    def read_tensors(
        self, select: Callable[[str], bool], device: torch.device | str = "cpu", dtype: torch.dtype | None = None
    ) -> dict[str, torch.Tensor]:
        """The stored tensors whose names `select` accepts, converted to `dtype` (None: as stored)."""
        from safetensors import SafetensorError, safe_open

        state: dict[str, torch.Tensor] = {}
        for file in self.weight_files:
            try:
                with safe_open(str(file), framework="pt", device=str(device)) as f:
                    for name in f.keys():
                        if select(name):
                            tensor = f.get_tensor(name)
                            state[name] = tensor if dtype is None else tensor.to(dtype)
            except (SafetensorError, OSError, RuntimeError) as exc:
                raise CheckpointError(f"corrupt weights file {file.name}: {_first_line(exc)}") from None
        return state

    def tensor_names(self) -> list[str]:
        """Names of all stored tensors (headers only: no weights are read)."""
        from safetensors import SafetensorError, safe_open

        names: list[str] = []
        for file in self.weight_files:
            try:
                with safe_open(str(file), framework="pt") as f:
                    names.extend(f.keys())
            except (SafetensorError, OSError, RuntimeError) as exc:
                raise CheckpointError(f"corrupt weights file {file.name}: {_first_line(exc)}") from None
        return names


def read_config(path: str | Path) -> ModelConfig:
    """The model's shape from config.json alone (no weights needed: a job can be planned before a download)."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"model directory not found: {root}")
    return ModelConfig.from_dict(_read_json(root / "config.json", "config.json"))


HEADS_FILE = "heads.safetensors"
# The authors' released checkpoints (TokenSwift-Llama-3.1-8B, ...) keep their draft blocks beside the base weights
# under this prefix; they are not part of the base model (see `released.py`).
EMBEDDED_HEADS_PREFIX = "model.medusa_layers."


def _is_base_weight(name: str) -> bool:
    return not name.endswith("rotary_emb.inv_freq") and not name.startswith(EMBEDDED_HEADS_PREFIX)


def default_model_dir() -> Path | None:
    """The demonstration model shipped inside the package, or None if this install has none."""
    from importlib.resources import files

    root = Path(str(files("longswift") / "default_model"))
    return root if (root / "config.json").is_file() else None


def model_dir_or_default(model: str | Path | None) -> Path:
    """The model directory asked for, or the embedded one; the one place that says neither exists."""
    if model is not None:
        return Path(model)
    root = default_model_dir()
    if root is None:
        raise CheckpointError("no model given (--model DIR) and this install has no embedded default model")
    return root


def heads_beside(model_dir: Path) -> Path | None:
    """Draft heads stored in the model directory under the conventional name, if any."""
    path = model_dir / HEADS_FILE
    return path if path.is_file() else None


def _weight_files(root: Path) -> tuple[Path, ...]:
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index, index.name).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index.name} has no weight_map")
        files = tuple(root / name for name in sorted(set(weight_map.values())))
        absent = [f.name for f in files if not f.exists()]
        if absent:
            raise CheckpointError(f"shards listed in {index.name} are missing: {', '.join(absent[:3])}")
        return files
    # A single model.safetensors wins over other *.safetensors files (e.g. draft heads kept beside the model).
    single = root / "model.safetensors"
    files = (single,) if single.exists() else tuple(sorted(root.glob("*.safetensors")))
    if not files:
        pickled = [p.name for p in root.glob("*.bin")] + [p.name for p in root.glob("*.pt")]
        hint = f" (found {pickled[0]}; pickled weights are never loaded, convert to safetensors)" if pickled else ""
        raise CheckpointError(f"no *.safetensors weights in {root}{hint}")
    return files


def _read_json(path: Path, name: str) -> dict[str, Any]:
    if not path.exists():
        raise CheckpointError(f"{name} not found in {path.parent}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{name} in {path.parent} is not valid JSON: {_first_line(exc)}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{name} in {path.parent} is not a JSON object")
    return data


def root_json(path: Path) -> dict[str, Any]:
    """An optional JSON file: {} when absent."""
    return _read_json(path, path.name) if path.exists() else {}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def assign_weights(
    model: Transformer, state: dict[str, torch.Tensor], source: Path, device: torch.device | str
) -> Transformer:
    """Give a model built on the meta device exactly the tensors of `state` (no copy), tie the LM head when the
    config says so, and set up RoPE on `device`. A missing or unexpected name is a CheckpointError naming `source`
    (whole checkpoints and tensor-parallel shards alike)."""
    tied = model.cfg.tie_word_embeddings
    expected = set(model.state_dict())
    if tied:
        expected.discard("lm_head.weight")
        state.pop("lm_head.weight", None)
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        detail = f"missing {sorted(missing)[:3]}" if missing else f"unexpected {sorted(unexpected)[:3]}"
        raise CheckpointError(f"weights in {source} do not match config.json: {detail}")
    try:
        model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:
        raise CheckpointError(f"weights in {source} do not match config.json: {str(exc).splitlines()[-1]}") from None
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.setup_rope(device)
    return model.eval().requires_grad_(False)
