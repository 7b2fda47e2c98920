"""scripts/gpu_check.py must work when a device is finally lent: its whole pipeline, run small on a CPU."""

from __future__ import annotations

import json

from longswift.bench.device_check import Check, CheckConfig


def test_the_gpu_check_runs_every_part_and_writes_one_json(tmp_path):
    out = tmp_path / "check.json"
    cfg = CheckConfig(
        out=out,
        device="cpu",
        dtype="fp32",
        models=("qwen2.5-1.5b",),
        contexts=(64, 160),
        tiny=True,
        budget_s=600,
        ar_tokens=3,
        replay_tokens=24,
        identity_tokens=48,
        compile=False,
    )
    Check(cfg).run()
    results = json.loads(out.read_text())
    assert results["skipped"] == []
    model = results["models"]["qwen2.5-1.5b"]
    for part in ("build", "ar", "verify", "replay", "hf"):
        assert part in model and "error" not in json.dumps(model[part]), (part, model[part])
    assert set(model["ar"]["160"]) >= {"eager_ms", "compiled_ms", "bound_ms"}
    assert model["verify"]["64"]["compiled_ratio"]["1"] == 1.0 and len(model["verify"]["64"]["eager_ms"]) == 8
    assert model["replay"]["accept_0.8"]["identical"] and model["replay"]["accept_0.8"]["tokens_per_step"] > 1.5
    assert all(r["identical"] for r in results["identity_fp32"].values() if isinstance(r, dict))
