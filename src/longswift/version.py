"""The version, written only here: pyproject.toml reads it (`[tool.setuptools.dynamic]`), `longswift` re-exports it."""

__version__ = "0.1.0"
