"""Training TokenSwift's draft heads on a frozen base model (`longswift train-heads`).

Modules: `data` (documents -> one token stream -> random windows), `state` (the resumable state file) and `loop`
(configuration, the loss, the optimizer, evaluation). The public names are re-exported here, where they were before the
package existed.
"""

from .data import load_token_stream, read_texts, sample_windows, token_stream
from .loop import TrainConfig, TrainReport, evaluate_heads, lr_at, make_optimizer, train_heads
from .state import STATE_FORMAT, STATE_KEY, StepStats, load_state, save_state

__all__ = [
    "STATE_FORMAT",
    "STATE_KEY",
    "StepStats",
    "TrainConfig",
    "TrainReport",
    "evaluate_heads",
    "load_state",
    "load_token_stream",
    "lr_at",
    "make_optimizer",
    "read_texts",
    "sample_windows",
    "save_state",
    "token_stream",
    "train_heads",
]
