#!/usr/bin/env bash
# Peer venv for benchmarks/translate_speed.py: Hugging Face MarianMTModel and CTranslate2 beside our torch pin.
#
#   bash benchmarks/envs/translate.sh            # creates or reuses .venv-translate (~1.3 GB, ~1-2 min)
#   VENV=/tmp/tr bash benchmarks/envs/translate.sh
#
# Peers are benchmark-only: never a runtime dependency of our package, never in .venv. torch is
# pinned to the same 2.13.0 CPU wheel as .venv, so our model and MarianMTModel run on the same
# kernels and the benchmark compares implementations, not torch builds. CTranslate2 brings its own
# C++ kernels (oneDNN / MKL), which is the point of that comparison.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-translate}
PYTHON=${PYTHON:-python3}
source benchmarks/envs/_peer_venv.sh  # TORCH, PIP, peer_venv_start, check_torch_pin
TRANSFORMERS=transformers==5.23.0
CTRANSLATE2=ctranslate2==4.8.5

# 1. torch first, through our constraints, so pip takes the CPU wheel (not the CUDA build).
peer_venv_start
# 2. The peers with the torch requirement repeated: pip must keep 2.13.0 rather than replace it.
#    sentencepiece: CTranslate2's Marian converter and MarianTokenizer import it.
"${PIP[@]}" "$TRANSFORMERS" "$CTRANSLATE2" "$TORCH" -c constraints.txt
# 3. Our package, through the same constraints as .venv (Lightning, numpy, rich, ... at our versions).
"${PIP[@]}" -c constraints.txt "$TORCH" -e .

check_torch_pin
"$VENV/bin/python" - <<'PY'
import ctranslate2, numpy, torch, transformers
from transformers import MarianConfig, MarianMTModel  # noqa: F401
import translate.model.transformer, translate.search.decoding  # our package imports beside the peers
print(f"ok: transformers {transformers.__version__}, ctranslate2 {ctranslate2.__version__}, "
      f"torch {torch.__version__}, numpy {numpy.__version__}")
PY
