#!/usr/bin/env bash
# Peer venv for benchmarks/translate_speed.py: Hugging Face MarianMTModel and CTranslate2 beside our torch pin (the
# same CPU wheel as .venv: the benchmark compares implementations; CTranslate2 brings its own C++ kernels).
#   bash benchmarks/envs/translate.sh            # creates or reuses .venv-translate (~1.3 GB, ~1-2 min)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-translate}
PYTHON=${PYTHON:-python3}
source benchmarks/envs/_peer_venv.sh  # TORCH, PIP, peer_venv_start, check_torch_pin
TRANSFORMERS=transformers==5.23.0
CTRANSLATE2=ctranslate2==4.8.5
peer_venv_start
"${PIP[@]}" "$TRANSFORMERS" "$CTRANSLATE2" "$TORCH" -c constraints.txt  # sentencepiece comes via constraints
"${PIP[@]}" -c constraints.txt "$TORCH" -e .
check_torch_pin
"$VENV/bin/python" - <<'PY'
import ctranslate2, torch, transformers
from transformers import MarianConfig, MarianMTModel  # noqa: F401
import translate.model.transformer, translate.search.decoding  # our package imports beside the peers
print(f"ok: transformers {transformers.__version__}, ctranslate2 {ctranslate2.__version__}, torch {torch.__version__}")
PY
