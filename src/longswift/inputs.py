"""Validation of what users hand in: prompt text and token ids, integer settings, config.json value types, API keys.

One layer, called wherever input enters (the CLI, generate-batch's prompts file, the server's requests, and
`Engine.encode` under all of them), so a bad value always becomes one `LongswiftError` line (a 400 on the server)
instead of a traceback from the tokenizer, torch or the file system further down.
"""

from __future__ import annotations

import argparse
import codecs
import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import CheckpointError, ConfigError, PromptError

# torch.Generator.manual_seed takes any 64-bit value, signed or unsigned; beyond that it overflows.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def check_text(text: str, what: str = "the prompt") -> str:
    """`text`, if it can be encoded as UTF-8; a lone UTF-16 surrogate (valid JSON "\\ud800", or undecodable bytes
    on a command line) cannot be, and no tokenizer can take it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PromptError(
            f"{what} is not valid text: character {exc.start} is U+{ord(text[exc.start]):04X}, a lone "
            "surrogate that cannot be encoded as UTF-8"
        ) from None
    return text


def check_ids(ids: Sequence[Any], vocab_size: int) -> list[int]:
    """Token ids as a list of ints (numpy and torch integers are taken), each in [0, vocab_size)."""
    out = []
    for i, token in enumerate(ids):
        try:
            if isinstance(token, bool):
                raise TypeError
            value = operator.index(token)
        except TypeError:
            raise PromptError(f"token id at position {i} is not an integer: {token!r}") from None
        if not 0 <= value < vocab_size:
            raise PromptError(f"token id {value} at position {i} is outside the vocabulary [0, {vocab_size})")
        out.append(value)
    return out


def check_seed(seed: int | None) -> int | None:
    if seed is not None and (isinstance(seed, bool) or not SEED_MIN <= seed <= SEED_MAX):
        raise ConfigError(f"seed must be a 64-bit integer (in [-2**63, 2**64 - 1]), got {seed}")
    return seed


def check_at_least(name: str, value: int | None, low: int) -> None:
    if value is not None and value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value}")


def check_job_flags(args: argparse.Namespace) -> None:
    """The integer flags of generate and generate-batch, before any work."""
    check_at_least("--tp", args.tp, 1)
    check_at_least("--checkpoint-every", args.checkpoint_every, 1)
    if not args.checkpoint_seconds >= 0:  # NaN too
        raise ConfigError(f"--checkpoint-seconds must be >= 0 (0: by tokens only), got {args.checkpoint_seconds}")
    check_at_least("--log-every", args.log_every, 1)
    check_at_least("--max-new-tokens", args.max_new_tokens, 1)
    check_seed(args.seed)
    for stop in args.stop:
        check_text(stop, "a --stop string")


# config.json fields read as numbers or flags (config.py); a value of another JSON type is the config's fault.
_INT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "sliding_window",
)
_FLOAT_FIELDS = ("rms_norm_eps", "rope_theta")
_BOOL_FIELDS = ("attention_bias", "mlp_bias", "tie_word_embeddings", "use_sliding_window")


def check_config_types(raw: dict[str, Any]) -> None:
    """Refuse config.json values of the wrong JSON type, naming the field (before transformers' tokenizer loading
    trips over the same value and the message blames the tokenizer)."""
    for name in _INT_FIELDS:
        value = raw.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise CheckpointError(f"config.json: {name} must be an integer, got {value!r}")
    for name in _FLOAT_FIELDS:
        value = raw.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise CheckpointError(f"config.json: {name} must be a number, got {value!r}")
    for name in _BOOL_FIELDS:
        value = raw.get(name)
        if value is not None and not isinstance(value, bool):
            raise CheckpointError(f"config.json: {name} must be true or false, got {value!r}")


def check_api_key(key: str | None) -> None:
    """An API key clients can send in a header: not empty (that would silently mean no authentication), no
    surrounding white space and no control characters (neither survives a header)."""
    if key is None:
        return
    if not key:
        raise ConfigError(
            "--api-key is empty; give a key, or leave --api-key (and $LONGSWIFT_API_KEY) unset to "
            "serve without authentication"
        )
    if key != key.strip() or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ConfigError("--api-key must not start or end with white space or hold control characters")
    check_text(key, "--api-key")


def _user_file(path: Path, what: str) -> bytes:
    """The bytes of the user's `what` ("prompt file", "prompts file"), or one clear `PromptError` for a missing,
    unreadable or UTF-16 file (UTF-16 is refused whole: read as UTF-8, not one of its characters would be right)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PromptError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise PromptError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise PromptError(f"{what} {path} is UTF-16 (it starts with a UTF-16 byte-order mark); save it as UTF-8")
    return data


def prompt_file_text(path: Path) -> str:
    """The text of `generate --prompt-file` (UTF-8), or one `PromptError` naming its first byte that is not UTF-8.

    One byte-order mark at the very start (a file saved by a Windows editor) is dropped: it is no part of the prompt,
    and the model would otherwise see it as text. The bad byte is named by its line (counted in newlines) and its
    1-based byte in that line and in the file, as a hex editor or `sed -n Np` finds it.
    """
    data = _user_file(path, "prompt file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)  # rfind is -1 on line 1: column is then start + 1
        raise PromptError(
            f"prompt file {path} is not valid UTF-8: byte 0x{data[exc.start]:02X} at line {line}, byte {column} of "
            f"the line (byte {exc.start + 1} of the file); save it as UTF-8"
        ) from None
    return text.removeprefix("\ufeff")


def prompt_file_lines(path: Path) -> list[str]:
    """The lines of a prompts file (UTF-8), or one clear `PromptError` for a missing, unreadable or UTF-16 file.

    A byte that is not UTF-8 spoils its own line only: it is decoded as a lone surrogate (Python's
    "surrogateescape"), which `undecodable` then names for that line, so the other lines still run. A byte-order
    mark at the start of a line (a file saved by a Windows editor, or files concatenated from such) is dropped: it is
    no part of the JSON.
    """
    data = _user_file(path, "prompts file")
    return [line.removeprefix("\ufeff") for line in data.decode("utf-8", "surrogateescape").splitlines()]


def undecodable(line: str) -> str | None:
    """What is wrong with a line of `prompt_file_lines` that held bytes that are not UTF-8, or None.

    Valid UTF-8 never decodes to a lone surrogate (it cannot encode one), so every surrogate in such a line is a
    byte the decoder escaped, and U+DC80 + b is byte b. A JSON escape such as "\\ud800" is six ASCII characters
    here, not a surrogate: `check_text` refuses it once the JSON is parsed.
    """
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as exc:
        column = len(line[: exc.start].encode("utf-8", "surrogateescape")) + 1
        byte = ord(line[exc.start]) - 0xDC00
        return f"not valid UTF-8 (byte 0x{byte:02X} at byte {column} of the line); save the file as UTF-8"
    return None
