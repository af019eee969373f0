#!/usr/bin/env bash
# Peer venv for benchmarks/streamrec_rectools.py: RecTools' SASRec beside our torch pin (the same CPU wheel as
# .venv, so the race compares implementations, not torch builds). rectools[torch] pulls numpy 1.26 and Lightning
# 2.5.x, which is why it does not go into .venv.
#   bash benchmarks/envs/rectools.sh            # creates or reuses .venv-rectools (~1.3 GB, ~1-2 min)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-rectools}
PYTHON=${PYTHON:-python3}
source benchmarks/envs/_peer_venv.sh  # TORCH, PIP, peer_venv_start, check_torch_pin
peer_venv_start
# Not `-c constraints.txt`: its numpy/Lightning pins conflict with RecTools' own.
"${PIP[@]}" "rectools[torch]==0.19.0" "$TORCH"
# RecTools imports `pytorch_lightning`, we import `lightning`: the unified package at the same version. pyarrow 26
# needs numpy 2 at import (undeclared); 25.x is the last that runs on 1.26.
PL=$("$VENV/bin/python" -m pip show pytorch-lightning | sed -n 's/^Version: //p')
"${PIP[@]}" "$TORCH" "lightning==$PL" "pytorch-lightning==$PL" "pyarrow<26" -e .
check_torch_pin
"$VENV/bin/python" - <<'PY'
import lightning, numpy, rectools, torch
import streamrec.model.module, streamrec.score  # our package imports under RecTools' Lightning/numpy
print(f"ok: rectools {rectools.__version__}, torch {torch.__version__}, lightning {lightning.__version__}, "
      f"numpy {numpy.__version__}")
PY
