"""What the GPU check measures and how long each section may take: `CheckConfig` and the ordered section plan.

The plan is ordered by value (what a short lease must bring back first) and every section has its own budget, so
one slow section (a compile that takes minutes) cannot eat the sections after it; the first device run lost the
8B shape to the 1.5B shape's compile that way. Budgets are seconds of wall time on the device, start-up of the
section's process included; the whole check stops starting sections at `budget_s`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

GPU_CONTEXTS = (4096, 32768, 100_000)
TINY_CONTEXTS = (256, 1024, 2048)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SECTION_KINDS = ("shape", "cuda_tests", "demo", "compile", "hf", "batched", "identity", "sampled")
SAMPLED_CONTEXTS = (8192, 20480)  # issue 39's sampled target: >= 1.25x AR at 8K and 20K


@dataclass(frozen=True)
class CheckConfig:
    """Everything a section needs; written to a file for the section's own process (`to_json`, `from_json`)."""

    out: Path = Path("benchmarks/gpu/gpu_check.json")
    device: str = "cuda"
    dtype: str = "bf16"
    models: tuple[str, ...] = ("llama-3.1-8b", "qwen2.5-1.5b")  # by value: the first run never reached the 8B
    contexts: tuple[int, ...] = GPU_CONTEXTS
    tiny: bool = False  # tiny shapes and contexts (the CPU trial of the whole check)
    budget_s: float = 420.0  # the whole check: no section starts after this
    compile: bool = True  # False: the static path run eagerly (a quick test of the check itself)
    ar_tokens: int = 24  # timed AR steps per measurement (transformers' decoder: 4x as many tokens)
    replay_tokens: int = 128
    replay_accept: tuple[float, ...] = (0.84, 0.6)  # the first is the target's
    replay_depth: int = 4
    batch_model: str = "qwen2.5-1.5b"
    batch_size: int = 8
    batch_context: int = 4096
    batch_tokens: int = 64
    hf_model: str = "llama-3.1-8b"  # transformers' decoder: the shape of the replay target
    warm_models: tuple[str, ...] = ("llama-3.1-8b",)  # compile warm (a second process): the target's shape
    demo_tokens: int = 0  # 0: the demo's own default (what a user runs)
    identity_tokens: int = 1000
    sampled_contexts: tuple[int, ...] = SAMPLED_CONTEXTS  # the embedded model's held-out prompts (device_sampled)
    sampled_tokens: int = 512  # sampled new tokens per variant and context
    sections: tuple[str, ...] = ()  # only these section names (or kinds); () = all

    @classmethod
    def tiny_trial(cls, **changes: Any) -> CheckConfig:
        """The CPU trial: tiny shapes, short contexts, fp32, a shorter demo and identity run."""
        base = dict(
            device="cpu",
            dtype="fp32",
            contexts=TINY_CONTEXTS,
            tiny=True,
            budget_s=400.0,
            batch_context=256,
            batch_tokens=32,
            replay_tokens=64,
            demo_tokens=128,
            identity_tokens=200,
            sampled_contexts=(256, 512),
            sampled_tokens=32,
        )
        return cls(**{**base, **changes})

    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def to_json(self) -> str:
        data = asdict(self)
        data["out"] = str(self.out)
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> CheckConfig:
        data = json.loads(text)
        tuples = {f.name for f in fields(cls) if str(f.type).startswith("tuple")}
        data = {k: tuple(v) if k in tuples else v for k, v in data.items()}
        return cls(**{**data, "out": Path(data["out"])})

    def with_sections(self, sections: tuple[str, ...]) -> CheckConfig:
        return replace(self, sections=sections)


@dataclass(frozen=True)
class SectionPlan:
    """One section: its name (kind[:model]), its budget, and what it is for."""

    name: str
    budget_s: float
    why: str

    @property
    def kind(self) -> str:
        return self.name.partition(":")[0]

    @property
    def model(self) -> str:
        return self.name.partition(":")[2]


# GPU budgets (seconds, the section's process start-up included). Expected use per section is in BENCHMARKS.md.
SHAPE_BUDGET_S = {"llama-3.1-8b": 115.0, "qwen2.5-1.5b": 85.0}
BUDGET_S = {
    "cuda_tests": 95.0,
    "demo": 65.0,
    "compile": 30.0,
    "hf": 60.0,
    "batched": 45.0,
    "identity": 30.0,
    "sampled": 150.0,
}
# The CPU trial's (two shared cores compile slowly; the sizes are tiny).
TINY_BUDGET_S = {
    "shape": 75.0,
    "cuda_tests": 60.0,
    "demo": 60.0,
    "compile": 45.0,
    "hf": 30.0,
    "batched": 40.0,
    "identity": 75.0,
    "sampled": 90.0,
}


def section_plan(cfg: CheckConfig) -> list[SectionPlan]:
    """The sections in the order they run (by value), with their budgets; `cfg.sections` filters by name or kind."""
    plan: list[SectionPlan] = []

    def budget(kind: str, model: str = "") -> float:
        if cfg.tiny:
            return TINY_BUDGET_S[kind]
        return SHAPE_BUDGET_S.get(model, 100.0) if kind == "shape" else BUDGET_S[kind]

    for model in cfg.models:
        plan.append(SectionPlan(f"shape:{model}", budget("shape", model), "AR vs bound, compile cold, c(n), replay"))
    plan += [
        SectionPlan("cuda_tests", budget("cuda_tests"), "pytest tests/test_cuda.py: the guarantees on this device"),
        SectionPlan("demo", budget("demo"), "longswift demo, cold: what a new user runs first"),
    ]
    plan += [SectionPlan(f"compile:{m}", budget("compile"), "compile warm: a second process") for m in cfg.warm_models]
    plan += [
        SectionPlan(f"hf:{cfg.hf_model}", budget("hf"), "transformers' static-cache compiled decoder: the peer"),
        SectionPlan("batched", budget("batched"), f"B={cfg.batch_size} AR and TokenSwift vs sequential"),
        SectionPlan("identity", budget("identity"), "fp32 greedy identity, eager and compiled, embedded model"),
        SectionPlan(
            "sampled",
            budget("sampled"),
            f"sampled TokenSwift vs AR, embedded model, after {' and '.join(map(str, cfg.sampled_contexts))} tokens",
        ),
    ]
    if cfg.sections:
        plan = [s for s in plan if s.name in cfg.sections or s.kind in cfg.sections]
    return plan
