#!/usr/bin/env bash
# Everything a lent GPU machine runs for the training-speed work, in one call of about 8 minutes: the environment,
# the CUDA tests, long-history attention, then benchmarks/gpu_train.py for each preset (StreamRec beside the last),
# each writing --json into $OUT (default runs/gpu), and summary.txt of the stages, MFU and ratios.
#   run(command="bash benchmarks/gpu/run_all.sh", timeout_s=600)                 # through the device tool
#   run(command="bash benchmarks/gpu/run_all.sh", carry=[".whl"], timeout_s=600) # with wheels: fetch_wheels.sh
# Knobs: BUDGET_S (500, the whole script; every stage also has a cap), PRESETS ("d1024 d512 multi30k"),
# COMPILE ("default"), STEPS (10). A dry run on a CPU:
#   ALLOW_CPU=1 PRESETS=tiny COMPILE=none STEPS=1 bash benchmarks/gpu/run_all.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
LOG=$OUT/run_all.log SUMMARY=$OUT/summary.txt BUDGET_S=${BUDGET_S:-500} PRESETS=${PRESETS:-d1024 d512 multi30k}
COMPILE=${COMPILE:-default} STEPS=${STEPS:-10} START=$SECONDS
: >"$LOG"
: >"$SUMMARY"
export PYTHONUNBUFFERED=1

# stage NAME CAP_S COMMAND...: run under `timeout` for at most CAP_S and what is left of the budget; log it.
stage() {
    local name=$1 cap=$2 left=$((BUDGET_S - (SECONDS - START))) t0=$SECONDS rc what=ok
    shift 2
    if ((left < 30)); then
        echo "$name: skipped, the ${BUDGET_S} s budget is spent" | tee -a "$LOG" >>"$SUMMARY"
        return
    fi
    ((cap > left)) && cap=$left
    echo "=== $name (at most ${cap} s)" | tee -a "$LOG"
    timeout --kill-after=10 "$cap" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    ((rc == 124 || rc == 137)) && what="stopped at its ${cap} s cap"
    ((rc != 0 && rc != 124 && rc != 137)) && what=failed
    echo "$name: $what (exit $rc, $((SECONDS - t0)) s)" | tee -a "$LOG" >>"$SUMMARY"
}

if compgen -G ".whl/*.whl" >/dev/null; then  # carried wheels first
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl 2>&1 | tee -a "$LOG"
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
# What the runs import (transformers is optional: without it gpu_train.py reports HF's rows as skipped).
stage environment 60 python3 -c '
import importlib, os, sys, torch
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, {gpu}")
for name in ("lightning", "torchmetrics", "sentencepiece", "sacrebleu", "rich", "filelock", "pytest", "transformers",
             "translate.model.module", "streamrec.model.module"):
    try:
        print(" ", name, getattr(importlib.import_module(name), "__version__", ""))
    except Exception as e:  # every failure, not only ImportError
        if name != "transformers":
            raise SystemExit(f"error: {name}: {e}; bring it: bash benchmarks/gpu/fetch_wheels.sh, carry [\".whl\"]")
        print(f"  {name}: MISSING ({e})")
if gpu == "no GPU" and os.environ.get("ALLOW_CPU") != "1":
    raise SystemExit("error: torch sees no CUDA device (ALLOW_CPU=1 for a dry run on a CPU)")
'
grep -q "^environment: ok" "$SUMMARY" || { echo "the environment check failed: nothing else runs"; cat "$SUMMARY"; exit 1; }
stage cuda-tests 120 python3 -m pytest -q -p no:cacheprovider --junitxml="$OUT/cuda_tests.xml" \
    tests/core/test_cuda.py tests/streamrec/test_cuda.py tests/translate/test_cuda.py \
    "tests/streamrec/ranking/test_topk.py::test_bf16_scan_on_cuda_sums_in_fp32_and_restores_the_setting"
stage long-attention 60 python3 benchmarks/long_attention.py --device cuda --lengths 1024 4096 --repeats 3 \
    --json "$OUT/long_attention_cuda.json"
for preset in $PRESETS; do
    sections=translate cap=170
    [[ $preset == d1024 ]] && cap=210
    [[ $preset == "${PRESETS##* }" ]] && sections="translate streamrec" && cap=120
    # shellcheck disable=SC2086  # COMPILE and sections are word lists on purpose
    stage "gpu_train $preset" "$cap" python3 benchmarks/gpu_train.py --preset "$preset" --sections $sections \
        --compile $COMPILE --steps "$STEPS" --json "$OUT/gpu_train_$preset.json"
done

# The ratios and MFU lines gpu_train.py printed (the tables are in run_all.log, the figures in the JSONs).
grep -hE "^(peak GEMM|MFU of|ours.* / HF)" "$LOG" >>"$SUMMARY"
echo "=== done in $((SECONDS - START)) s" | tee -a "$LOG"
cat "$SUMMARY"
