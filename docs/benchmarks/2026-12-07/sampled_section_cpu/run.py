import json, time, torch
from pathlib import Path
torch.set_num_threads(1)
from longswift.bench.device_config import CheckConfig
from longswift.bench.device_sections import run_section
cfg = CheckConfig(device="cpu", dtype="fp32", compile=False, sections=("sampled",))
t = time.perf_counter()
res = run_section(cfg, "sampled", Path("/tmp/cpusampled/sampled_cpu.json"), 1500)
print("wall", time.perf_counter() - t)
print(json.dumps(res, indent=1)[:6000])
