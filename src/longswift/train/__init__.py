"""Training TokenSwift's draft heads on a frozen base model (`longswift train-heads`).

The trainer lives in `loop`; its public names are re-exported here, where they were before the package existed.
"""

from .loop import (STATE_FORMAT, STATE_KEY, StepStats, TrainConfig, TrainReport, evaluate_heads, load_state,
                   load_token_stream, lr_at, make_optimizer, read_texts, sample_windows, save_heads, save_state,
                   token_stream, train_heads)

__all__ = ["STATE_FORMAT", "STATE_KEY", "StepStats", "TrainConfig", "TrainReport", "evaluate_heads", "load_state",
           "load_token_stream", "lr_at", "make_optimizer", "read_texts", "sample_windows", "save_heads",
           "save_state", "token_stream", "train_heads"]
