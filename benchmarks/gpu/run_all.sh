#!/usr/bin/env bash
# Everything a lent GPU machine should run for the training-speed work, in one call of about 8 minutes:
# the environment, the CUDA tests, then benchmarks/gpu_train.py for d1024, d512 and multi30k (+ StreamRec),
# each writing --json into $OUT, and a summary of the ratios and targets.
#
# Through the device tool, from this repository's root here (one call; the machine starts bare):
#   run(command="bash benchmarks/gpu/run_all.sh", timeout_s=600)
#   run(command="bash benchmarks/gpu/run_all.sh", carry=[".whl"], timeout_s=600)   # with wheels, see below
# Wheels: none are needed on the image described in the device notes (it has torch, Lightning, transformers,
# pytest, ...). To run on our pinned versions, or when the first stage reports a missing module, fetch them
# here first with `bash benchmarks/gpu/fetch_wheels.sh [NAME ...]` (into .whl/, pinned as constraints.txt pins)
# and name ".whl" in carry; this script installs whatever .whl/ holds before anything else.
# What comes back (at most 8 files in $OUT): gpu_train_{d1024,d512,multi30k}.json, cuda_tests.xml,
# long_attention_cuda.json, run_all.log (everything printed) and summary.txt. Off the device machine OUT
# defaults to runs/gpu.
#
# Knobs (environment): BUDGET_S (default 500) caps the whole script; each stage also has its own cap and never
# runs past the budget (a stage cut short keeps the sections it finished: gpu_train.py writes its JSON after
# each). PRESETS (default "d1024 d512 multi30k"), COMPILE (default "default"), STEPS (default 10).
# A dry run of this script on a CPU: ALLOW_CPU=1 PRESETS=tiny COMPILE=none STEPS=1 bash benchmarks/gpu/run_all.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
LOG=$OUT/run_all.log
SUMMARY=$OUT/summary.txt
BUDGET_S=${BUDGET_S:-500}
PRESETS=${PRESETS:-d1024 d512 multi30k}
COMPILE=${COMPILE:-default}
STEPS=${STEPS:-10}
START=$SECONDS
: >"$LOG"
: >"$SUMMARY"
export PYTHONUNBUFFERED=1

say() { echo "$*" | tee -a "$LOG"; }

# stage NAME CAP_S COMMAND...: run under `timeout` for at most CAP_S and what is left of the budget; log it.
stage() {
    local name=$1 cap=$2 left t0 rc
    shift 2
    left=$((BUDGET_S - (SECONDS - START)))
    if ((left < 30)); then
        echo "$name: skipped, the ${BUDGET_S} s budget is spent" | tee -a "$LOG" >>"$SUMMARY"
        return
    fi
    ((cap > left)) && cap=$left
    say "=== $name (at most ${cap} s; $((SECONDS - START)) s elapsed)"
    t0=$SECONDS
    timeout --kill-after=10 "$cap" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    local what="ok"
    ((rc == 124 || rc == 137)) && what="stopped at its ${cap} s cap"
    ((rc != 0 && rc != 124 && rc != 137)) && what="failed"
    echo "$name: $what (exit $rc, $((SECONDS - t0)) s)" | tee -a "$LOG" >>"$SUMMARY"
}

# 1. Wheels, if carried (the device notes' command), then our package from this checkout.
if compgen -G ".whl/*.whl" >/dev/null; then
    say "installing $(ls .whl/*.whl | wc -l) carried wheels into /tmp/site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl 2>&1 | tee -a "$LOG"
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# 2. The machine and what imports: stop early, with the fix, rather than spend the budget on failures.
say "$(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1)"
stage environment 60 python3 benchmarks/gpu/check_env.py
if ! grep -q "^environment: ok" "$SUMMARY"; then
    say "the environment check failed: nothing else runs"
    cat "$SUMMARY"
    exit 1
fi

# 3. The CUDA tests (skipped without a GPU elsewhere): fused kernels, bf16 gradients, cached decoding, top-k.
stage cuda-tests 120 python3 -m pytest -q -p no:cacheprovider --junitxml="$OUT/cuda_tests.xml" \
    tests/core/test_cuda.py tests/streamrec/test_cuda.py tests/translate/test_cuda.py \
    "tests/streamrec/ranking/test_topk.py::test_bf16_scan_on_cuda_sums_in_fp32_and_restores_the_setting"

# 4. Long-history attention on the GPU: full vs windowed (FlexAttention, and the SDPA blocks) vs linear.
stage long-attention 60 python3 benchmarks/long_attention.py --device cuda --lengths 1024 4096 --repeats 3 \
    --json "$OUT/long_attention_cuda.json"

# 5. The benchmark: translator at every preset; StreamRec once, beside the last (by default the smallest) one.
for preset in $PRESETS; do
    sections=translate
    cap=170
    [[ $preset == d1024 ]] && cap=210
    [[ $preset == "${PRESETS##* }" ]] && sections="translate streamrec" && cap=120
    # shellcheck disable=SC2086  # COMPILE and sections are word lists on purpose
    stage "gpu_train $preset" "$cap" python3 benchmarks/gpu_train.py --preset "$preset" --sections $sections \
        --compile $COMPILE --steps "$STEPS" --json "$OUT/gpu_train_$preset.json"
done

# 6. Summary: the stages, then each preset's rows and ratios from its JSON.
python3 - "$OUT" <<'PY' | tee -a "$LOG" >>"$SUMMARY"
import json, sys
from pathlib import Path

for path in sorted(Path(sys.argv[1]).glob("gpu_train_*.json")):
    f = json.loads(path.read_text())
    print(f"\n{path.name}: d_model {f.get('d_model')}, batch {f.get('batch_size')} x {f.get('length')}, "
          f"HF {'yes' if f.get('hf_available') else 'no'}")
    for key in sorted(k for k in f if k.endswith("_step_ms")):
        row = key[: -len("_step_ms")]
        speed = f.get(f"{row}_tok_s", f.get(f"{row}_seq_s", 0))
        mfu = f.get(f"{row}_mfu")
        print(f"  {row:42s} {f[key]:9.2f} ms  {speed:14,.0f}/s  peak {f.get(f'{row}_peak_mib', 0):9,.0f} MiB"
              + (f"  MFU {100 * mfu:5.1f}%" if mfu is not None else ""))
    preset = path.stem.removeprefix("gpu_train_")
    target = 1.3 if preset in ("d512", "d1024") else None  # ours' throughput over HF Marian's
    for key, floor in (("translate_speedup_vs_hf", target), ("translate_eager_speedup_vs_hf", target),
                       ("translate_mfu_best", 0.45 if preset == "d1024" else None)):
        if key in f:
            met = "" if floor is None else f"  target {floor}: {'yes' if f[key] >= floor else 'no'}"
            print(f"  {key:42s} {f[key]:.3f}{met}")
PY
say "=== done in $((SECONDS - START)) s"
cat "$SUMMARY"
