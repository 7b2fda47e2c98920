#!/usr/bin/env bash
# The two commands of the README. Both set everything up on a fresh machine first (idempotent, fast when done).
#   ./run.sh demo   generate with TokenSwift and AR side by side on the embedded model and print the speedup
#   ./run.sh test   lint (ruff), check the format and the types (mypy), then run the test suite;
#                   with pytest arguments (./run.sh test tests/test_cli.py) only those tests
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh >&2
case "${1:-demo}" in
  demo)
    shift || true
    if [ -f src/longswift/default_model/config.json ]; then exec .venv/bin/longswift demo "$@"; fi
    # No embedded model in this checkout: fall back to a random-weight checkpoint (timing and identity only).
    if [ ! -f build/tiny/config.json ]; then .venv/bin/python scripts/make_tiny_checkpoint.py build/tiny >&2; fi
    exec .venv/bin/longswift demo --model build/tiny "$@" ;;
  test)
    shift
    if [ $# -eq 0 ]; then  # the whole suite, as CI runs it: lint, format and types first (settings: pyproject.toml)
      .venv/bin/ruff check .
      .venv/bin/ruff format --check .
      .venv/bin/mypy
    fi
    exec .venv/bin/python -m pytest "$@" ;;
  *) echo "usage: ./run.sh demo|test [args]" >&2; exit 2 ;;
esac
