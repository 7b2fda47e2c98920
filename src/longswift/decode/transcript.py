"""What has been generated so far: token ids, incrementally decoded text, and the rules that end a generation.

Decoders hand over tokens one at a time (AR) or a verified block at a time (TokenSwift); the transcript checks
EOS ids, stop strings and the token budget after *each* token, so nothing past a stop is ever emitted, however
many tokens a block carried. Text is decoded incrementally over a short window of ids, holding back text that
ends in an incomplete UTF-8 sequence, so streamed pieces concatenate to exactly `text`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config import StopConfig


@dataclass
class Piece:
    """A streamed chunk: the text that became final and the token ids accepted since the previous piece."""

    text: str
    token_ids: list[int] = field(default_factory=list)


class Transcript:
    """Accepts generated tokens; owns stop rules and incremental detokenization."""

    def __init__(self, tokenizer: Any, stop: StopConfig) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self._eos = frozenset(stop.eos_token_ids)
        self._prefix = 0  # ids[_prefix:_read] decode to text already emitted (context for the next decode)
        self._read = 0
        self._piece_text = ""
        self._piece_ids: list[int] = []

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def push(self, token: int) -> bool:
        """Accept one token; True when generation must end with it (it is kept, as `transformers` does)."""
        if self.done:
            raise RuntimeError("transcript is finished")
        self.ids.append(token)
        self._piece_ids.append(token)
        added = self._decode_new()
        if token in self._eos and not self.stop.ignore_eos:
            self.finish_reason = "eos"
        elif added and self._hit_stop_string(len(added)):
            self.finish_reason = "stop_string"
        elif len(self.ids) >= self.stop.max_new_tokens:
            self.finish_reason = "length"
        return self.done

    def take(self) -> Piece:
        """The text and ids accepted since the last call (text held back at a broken character stays back)."""
        piece = Piece(self._piece_text, self._piece_ids)
        self._piece_text, self._piece_ids = "", []
        return piece

    def flush(self) -> Piece:
        """Like `take`, but also release held-back text; call once at the end."""
        rest = self._decode(self.ids[self._prefix :])[len(self._decode(self.ids[self._prefix : self._read])) :]
        self._read = len(self.ids)
        self._emit(rest)
        return self.take()

    def _decode_new(self) -> str:
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        full = self._decode(self.ids[self._prefix :])
        if len(full) <= len(prefix_text) or full.endswith("\ufffd"):
            return ""  # an incomplete character or a merge still pending: wait for more ids
        added = full[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self.ids)
        self._emit(added)
        return added

    def _emit(self, text: str) -> None:
        self.text += text
        self._piece_text += text

    def _hit_stop_string(self, added: int) -> bool:
        longest = max((len(s) for s in self.stop.stop_strings), default=0)
        tail = self.text[-(longest + added - 1) :] if longest else ""
        return any(s in tail for s in self.stop.stop_strings)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
