#!/usr/bin/env bash
# Creates .venv and installs longswift with its test dependencies, without ever pulling a CUDA build of torch
# onto a CPU machine: an existing torch is kept; where nvidia-smi works the default (CUDA) build is installed;
# elsewhere the CPU build torch==2.13.0+cpu, from a local wheel when pip's configuration has one (these
# machines) or from PyTorch's CPU index. An unreachable index is skipped quickly (--retries 0).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPIP=".venv/bin/python -m pip"
$VPIP install -q --upgrade pip 2>&1 | grep -v '^WARNING' || true
CPU_INDEX=https://download.pytorch.org/whl/cpu
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    $VPIP install -q torch
  else
    $VPIP install -q --retries 0 --timeout 15 "torch==2.13.0+cpu" --extra-index-url "$CPU_INDEX" 2>&1 \
      | grep -v -e '^WARNING' -e 'NameResolution' || true
    .venv/bin/python -c "import torch" 2>/dev/null || $VPIP install -q torch --index-url "$CPU_INDEX"
  fi
fi
$VPIP install -q -e ".[test,bench,serve]" 2>&1 | grep -v '^WARNING' || true
.venv/bin/python -c "import longswift, torch; print(f'longswift {longswift.__version__} ready (torch {torch.__version__})')"
