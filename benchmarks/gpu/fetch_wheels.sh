#!/usr/bin/env bash
# Wheels for benchmarks/gpu/run_all.sh into .whl/, for a GPU machine that cannot reach a registry; then call the
# device tool with carry [".whl"] (64 MiB at most). The machine's image already has torch, Lightning, transformers,
# pytest ...; carried wheels replace its versions with our pins. torch never travels. Each wheel comes --no-deps.
#   bash benchmarks/gpu/fetch_wheels.sh                   # the pure-Python packages our code imports, at our pins
#   bash benchmarks/gpu/fetch_wheels.sh transformers      # at benchmarks/envs/translate.sh's pin
set -euo pipefail
cd "$(dirname "$0")/../.."
DEFAULT=(rich lightning torchmetrics sentencepiece sacrebleu filelock)
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"  # wheels travel by carry, never by git
mkdir -p .whl
for name in "${@:-${DEFAULT[@]}}"; do
    if [[ $name == *==* ]]; then spec=$name
    elif [[ $name == transformers ]]; then spec=$(sed -n 's/^TRANSFORMERS=//p' benchmarks/envs/translate.sh)
    else spec=$(grep -iE "^$name==" constraints.txt) || { echo "error: $name is not pinned in constraints.txt" >&2; exit 2; }
    fi
    "${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl "$spec"
done
du -sh .whl
