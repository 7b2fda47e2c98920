"""The `longswift` command line: the only package that parses argv or prints.

Modules: `main` (the parser, `main(argv)` and the small commands), `options` (flags shared by several commands),
`job` (progress lines, signals, the compile note), `scale` (`--tp`, `--dry-run`, `generate-batch`), `demo` and
`serve` (the `serve` command; FastAPI is imported only when it runs).
"""

from .job import EXIT_INTERRUPTED, EXIT_USER_ERROR
from .main import build_parser, main, main_entry

__all__ = ["EXIT_INTERRUPTED", "EXIT_USER_ERROR", "build_parser", "main", "main_entry"]
