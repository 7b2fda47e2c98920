"""The exceptions a user of longswift can see.

Every mistake a user can make (a bad path, a bad flag value, a prompt that does not fit) raises a subclass of
`LongswiftError` whose message is one line with the numbers that were wrong. The CLI prints that line and exits
non-zero; anything else escaping is a bug in longswift, not in the user's input.
"""


class LongswiftError(Exception):
    """Base class of all user-facing errors."""

    # A tensor-parallel rank whose group lead prints the same line sets this, so that the line is printed once.
    silent: bool = False


class CheckpointError(LongswiftError):
    """A model directory is missing, incomplete, corrupt or of an unsupported architecture."""


class ConfigError(LongswiftError):
    """A sampling, speculation or generation setting is out of range."""


class PromptError(LongswiftError):
    """A prompt is empty, unreadable, or does not fit the model."""


class HeadsError(LongswiftError):
    """Draft heads are missing, corrupt, or were trained for another model."""


class UsageError(LongswiftError):
    """A command line that cannot be parsed (unknown flag, missing value, wrong type)."""


class ResumeError(LongswiftError):
    """A generation checkpoint is corrupt, or belongs to another model, heads, prompt or configuration."""


class NumericalError(LongswiftError):
    """The model produced non-finite logits (NaN or infinity), usually a dtype overflow at long context."""


class OutputError(LongswiftError):
    """An output file (checkpoint, stats, results) could not be written, e.g. the disk is full."""
