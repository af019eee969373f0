#!/usr/bin/env bash
# Download wheels for benchmarks/gpu/run_all.sh into .whl/, here, for a GPU machine that cannot reach a registry.
#
#   bash benchmarks/gpu/fetch_wheels.sh                      # the pure-Python packages our code imports, at our pins
#   bash benchmarks/gpu/fetch_wheels.sh transformers         # Marian's library at benchmarks/envs/translate.sh's pin
#   bash benchmarks/gpu/fetch_wheels.sh rich sacrebleu       # only these
#
# The machine's image already holds torch, Lightning, torchmetrics, sentencepiece, sacrebleu, rich, transformers
# and pytest (the device notes' package list), so run_all.sh runs without any wheel; carried wheels replace the
# image's versions with ours. torch itself never travels (GBs; the image's CUDA build is the point).
# Each wheel is fetched with --no-deps: a package whose needs the image lacks needs them named too
# (`unzip -p .whl/NAME-*.whl '*/METADATA' | grep ^Requires-Dist` lists them). Keep one version of each:
# two stop the whole install. Then call the device tool with carry [".whl"] (64 MiB at most travel).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEFAULT=(rich lightning torchmetrics sentencepiece sacrebleu filelock)
PYTHON=${PYTHON:-python3}

pin() {  # NAME -> NAME==VERSION from constraints.txt (transformers: from benchmarks/envs/translate.sh)
    local line
    if [[ $1 == transformers ]]; then
        line=$(sed -n 's/^TRANSFORMERS=//p' benchmarks/envs/translate.sh)
    else
        line=$(grep -iE "^$1==" constraints.txt || true)
    fi
    if [[ -z $line ]]; then
        echo "error: $1 is not pinned in constraints.txt; add the pin or pass NAME==VERSION" >&2
        exit 2
    fi
    echo "$line"
}

exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"  # wheels travel by carry, never by git
mkdir -p .whl
for name in "${@:-${DEFAULT[@]}}"; do
    [[ $name == *==* ]] && spec=$name || spec=$(pin "$name")
    "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$spec"
done
du -sh .whl
ls .whl
