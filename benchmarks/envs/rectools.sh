#!/usr/bin/env bash
# Peer venv for benchmarks/streamrec_rectools.py: RecTools' SASRec beside our torch pin.
#
#   bash benchmarks/envs/rectools.sh            # creates or reuses .venv-rectools (~1.3 GB, ~1-2 min)
#   VENV=/tmp/rt bash benchmarks/envs/rectools.sh
#
# rectools[torch] 0.19.0 pulls numpy 1.26 and Lightning 2.5.x, which is why it does not go
# into .venv (constraints.txt pins numpy 2.4.6 and Lightning 2.6.6). torch is pinned to the
# same 2.13.0 CPU wheel as .venv: both models then run on the same kernels, so the
# benchmark compares implementations, not torch builds.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-rectools}
PYTHON=${PYTHON:-python3}
source benchmarks/envs/_peer_venv.sh  # TORCH, PIP, peer_venv_start, check_torch_pin

# 1. torch first, through our constraints, so pip takes the CPU wheel (not the CUDA build).
peer_venv_start
# 2. RecTools with the torch requirement repeated: pip must keep 2.13.0 rather than replace it.
#    Not `-c constraints.txt` here: its numpy/Lightning pins conflict with RecTools' own.
"${PIP[@]}" "rectools[torch]==0.19.0" "$TORCH"
# 3. Our package. RecTools imports `pytorch_lightning`, we import `lightning`: add the unified
#    package at the same version (2.5.x >= our 2.4 floor), so pip keeps RecTools' set (numpy
#    1.26, Lightning 2.5.x); pyarrow 26 needs numpy 2 at import (undeclared), 25.x is the last
#    that runs on 1.26 (checked: 23, 24, 25 import and convert arrays).
PL=$("$VENV/bin/python" -m pip show pytorch-lightning | sed -n 's/^Version: //p')
"${PIP[@]}" "$TORCH" "lightning==$PL" "pytorch-lightning==$PL" "pyarrow<26" -e .

check_torch_pin
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import lightning, numpy, rectools, torch
import pyarrow
import streamrec.model.module, streamrec.score  # our package imports under RecTools' Lightning/numpy
print(f"ok: rectools {rectools.__version__}, torch {torch.__version__}, lightning {lightning.__version__}, "
      f"pytorch-lightning {md.version('pytorch-lightning')}, numpy {numpy.__version__}, pyarrow {pyarrow.__version__}")
PY
