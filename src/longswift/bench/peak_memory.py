"""`PeakMemory`: the peak memory of one timed run (CUDA allocator peak, or sampled resident set size on CPU)."""

from __future__ import annotations

import os
import threading

import torch

RSS_SAMPLE_S = 0.02


class PeakMemory:
    """Peak memory of one run. CUDA: torch.cuda.max_memory_allocated after a reset (bytes held by tensors).
    CPU: the process's resident set size, sampled every 20 ms by a background thread (ru_maxrss cannot be reset,
    so it cannot tell runs apart); includes both loaded models and the allocator's slack.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_mb: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif (rss := _rss_bytes()) is not None:
            self.peak_mb = rss / 2**20
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_S):
            rss = _rss_bytes()
            if rss is not None and self.peak_mb is not None:
                self.peak_mb = max(self.peak_mb, rss / 2**20)


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
