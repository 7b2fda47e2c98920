#!/usr/bin/env bash
# Creates .venv and installs longswift with its test dependencies, without ever pulling a CUDA build of torch
# onto a CPU machine: an existing torch is kept; else a local CPU wheel (torch==2.13.0+cpu) is used when the
# machine has one; else the CPU index on CPU machines, the default (CUDA) build where nvidia-smi works.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPIP=".venv/bin/python -m pip"
$VPIP install -q --upgrade pip 2>&1 | grep -v '^WARNING' || true
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if ! $VPIP install -q --no-index "torch==2.13.0" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
      $VPIP install -q torch
    else
      $VPIP install -q torch --index-url https://download.pytorch.org/whl/cpu
    fi
  fi
fi
$VPIP install -q -e ".[test,bench]" 2>&1 | grep -v '^WARNING' || true
.venv/bin/python -c "import longswift, torch; print(f'longswift {longswift.__version__} ready (torch {torch.__version__})')"
