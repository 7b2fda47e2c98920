"""What a benchmarked method is (`Method`) and how a method list is parsed from its text spec.

Specs look like "ar,hf,tokenswift:tree=1-3-3,k=8,budget=1024": kinds are comma-separated, options follow
`kind:` as `key=value`, also comma-separated (see `parse_methods`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from ..config import Candidates, SpeculationConfig
from ..errors import ConfigError

ENGINE_KINDS = ("ar", "tokenswift")
HF_KINDS = ("hf", "hf-lookup")
METHOD_KINDS = ENGINE_KINDS + HF_KINDS


@dataclass(frozen=True)
class Method:
    """One way of generating: `kind` says which implementation, the other fields its options."""

    name: str  # the label in tables and files, as the user wrote it
    kind: str  # ar | tokenswift | hf | hf-lookup
    speculation: SpeculationConfig | None = None  # tokenswift only
    hf_cache: str = "static"  # hf kinds: transformers cache_implementation (static | dynamic)
    hf_compile: bool = True  # hf kinds: let transformers torch.compile a static-cache decoder on GPU (its default)
    lookup_tokens: int = 10  # hf-lookup: prompt_lookup_num_tokens
    lookup_ngram: int = 2  # hf-lookup: max_matching_ngram_size
    attention: str = "auto"  # tokenswift: "dense" forces the dense-bias attention path (the pre-cascade reference)
    compile: str = "auto"  # engine kinds: compiled static-shape forwards (auto | on | off, compiled.py)
    replay: Replay | None = None  # tokenswift: the synthetic replay drafter instead of the heads (replay.py)


@dataclass(frozen=True)
class Replay:
    """`tokenswift:drafter=replay,accept=A,depth=D`: a chain of D tokens of the AR output, each right with
    probability A. Synthetic: it measures the engine at a chosen acceptance, never a real speedup."""

    accept: float = 0.8
    depth: int = 4


_TOKENSWIFT_KEYS = {
    "tree": "tree",
    "k": "ngram_topk",
    "ngram_topk": "ngram_topk",
    "budget": "kv_budget",
    "kv_budget": "kv_budget",
    "sink": "sink_tokens",
    "sink_tokens": "sink_tokens",
    "n": "ngram_n",
    "ngram_n": "ngram_n",
    "draft": "draft",
    "cand": "candidates",
    "candidates": "candidates",
    "lookup": "lookup",
}
_TOKENSWIFT_WORDS = {"draft", "candidates"}  # options whose values are words, not integers
_HF_KEYS = {"hf": ("cache", "compile"), "hf-lookup": ("cache", "compile", "tokens", "ngram")}


def parse_methods(text: str) -> list[Method]:
    """Parse a comma-separated method list; options follow `kind:` as `key=value`, also comma-separated.

    A fragment `key=value` without a `kind:` continues the options of the method before it, so
    "tokenswift:tree=1-3-3,k=8,ar" is two methods. Raises `ConfigError` naming the bad fragment.
    """
    groups: list[list[str]] = []
    for fragment in (f.strip() for f in text.split(",")):
        if not fragment:
            continue
        if ":" not in fragment and "=" in fragment:
            if not groups or ":" not in groups[-1][0]:
                raise ConfigError(f"method option {fragment!r} does not follow a method with options (kind:key=value)")
            groups[-1].append(fragment)
        else:
            groups.append([fragment])
    if not groups:
        raise ConfigError(f"no methods in {text!r}; use some of {', '.join(METHOD_KINDS)}")
    methods = [_method(g) for g in groups]
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ConfigError(f"a method is listed twice in {text!r}")
    return methods


def _method(group: list[str]) -> Method:
    kind, _, first = group[0].partition(":")
    kind = kind.strip()
    if kind not in METHOD_KINDS:
        raise ConfigError(f"unknown method {kind!r}; use {', '.join(METHOD_KINDS)}")
    options = _options([first, *group[1:]] if first or len(group) > 1 else [], group[0])
    name = ",".join(group)
    if kind in ENGINE_KINDS:
        compile_ = options.pop("compile", "auto")
        if compile_ not in ("auto", "on", "off"):
            raise ConfigError(f"option compile={compile_!r} in {name!r}: use auto, on or off")
    if kind == "ar":
        if options:
            raise ConfigError(f"method ar takes only the option compile, got {sorted(options)}")
        return Method(name, kind, compile=compile_)
    if kind == "tokenswift":  # plain `tokenswift`: the engine's defaults for its device (SpeculationConfig.for_device)
        attention = options.pop("attn", "auto")
        if attention not in ("auto", "dense"):
            raise ConfigError(f"option attn={attention!r} in {name!r}: use auto or dense")
        replay = _replay(options, name)
        if replay is not None:
            spec = SpeculationConfig(
                draft="fused",
                tree=(1,) * replay.depth,
                ngram_topk=0,
                lookup=0,
                candidates=cast(Candidates, options.pop("cand", "all")),
            )
            if options:
                raise ConfigError(
                    f"drafter=replay in {name!r} takes accept, depth, cand, attn and compile; got {sorted(options)}"
                )
            return Method(name, kind, speculation=spec, attention=attention, compile=compile_, replay=replay)
        return Method(
            name,
            kind,
            speculation=_speculation(options, name) if options else None,
            attention=attention,
            compile=compile_,
        )
    return _hf_method(name, kind, options)


def _replay(options: dict[str, str], name: str) -> Replay | None:
    """Pop drafter=replay and its accept/depth options; None for the heads' drafter."""
    drafter = options.pop("drafter", "heads")
    if drafter == "heads":
        if "accept" in options or "depth" in options:
            raise ConfigError(f"accept and depth in {name!r} go with drafter=replay")
        return None
    if drafter != "replay":
        raise ConfigError(f"option drafter={drafter!r} in {name!r}: use heads or replay")
    try:
        accept = float(options.pop("accept", "0.8"))
    except ValueError:
        raise ConfigError(f"option accept in {name!r} is not a number") from None
    if not 0.0 <= accept <= 1.0:
        raise ConfigError(f"option accept={accept} in {name!r}: use a probability in [0, 1]")
    depth = _int(options.pop("depth", "4"), "depth", name)
    if not 1 <= depth <= 64:
        raise ConfigError(f"option depth={depth} in {name!r}: use 1..64")
    return Replay(accept, depth)


def _options(fragments: list[str], spec: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for fragment in fragments:
        key, eq, value = (s.strip() for s in fragment.partition("="))
        if not eq or not key or not value:
            raise ConfigError(f"bad option {fragment!r} in method {spec!r}; expected key=value")
        if key in options:
            raise ConfigError(f"option {key!r} given twice in method {spec!r}")
        options[key] = value
    return options


def _speculation(options: dict[str, str], name: str) -> SpeculationConfig:
    values: dict[str, Any] = {}
    for key, raw in options.items():
        if key not in _TOKENSWIFT_KEYS:
            raise ConfigError(
                f"unknown tokenswift option {key!r} in {name!r}; "
                "use tree, k, budget, sink, n, draft, cand, lookup, attn, compile, drafter"
            )
        target = _TOKENSWIFT_KEYS[key]
        if target in values:
            raise ConfigError(f"option {target} given twice in {name!r}")
        if target in _TOKENSWIFT_WORDS:
            values[target] = raw
        else:
            values[target] = _tree(raw, name) if target == "tree" else _int(raw, key, name)
    return SpeculationConfig(**values)  # validates ranges, raising ConfigError


def _tree(raw: str, name: str) -> tuple[int, ...]:
    return tuple(_int(part, "tree", name) for part in raw.split("-"))


def _int(raw: str, key: str, name: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"option {key}={raw!r} in {name!r} is not an integer") from None


def _hf_method(name: str, kind: str, options: dict[str, str]) -> Method:
    unknown = set(options) - set(_HF_KEYS[kind])
    if unknown:
        raise ConfigError(f"unknown {kind} options {sorted(unknown)} in {name!r}; use {', '.join(_HF_KEYS[kind])}")
    # transformers 5.17 refuses a static cache for assisted (prompt-lookup) generation; 5.24 accepts it.
    cache = options.get("cache", "dynamic" if kind == "hf-lookup" else "static")
    if cache not in ("static", "dynamic"):
        raise ConfigError(f"{kind} cache must be static or dynamic, got {cache!r}")
    compile_ = options.get("compile", "auto")
    if compile_ not in ("auto", "off"):
        raise ConfigError(f"{kind} compile must be auto or off, got {compile_!r}")
    tokens = _int(options.get("tokens", "10"), "tokens", name)
    ngram = _int(options.get("ngram", "2"), "ngram", name)
    if tokens < 1 or ngram < 1:
        raise ConfigError(f"{kind} tokens and ngram must be >= 1, got {tokens} and {ngram}")
    return Method(name, kind, hf_cache=cache, hf_compile=compile_ == "auto", lookup_tokens=tokens, lookup_ngram=ngram)
