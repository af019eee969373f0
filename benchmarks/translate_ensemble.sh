#!/usr/bin/env bash
# Multi30k En->De in 2 hours on a 2-core CPU: two translators (configs/translate/multi30k_en_de.yaml with the
# inverse-sqrt schedule; the second with seed 2 and 8,192 tokens an update) train side by side, one thread each,
# for MAX_TIME; each is averaged over its last 10 checkpoints; then both translate test_2016_flickr as an
# ensemble (python -m translate.infer --ckpt A B: the mean of their probabilities) and alone.
#
#   bash benchmarks/translate_ensemble.sh [OUT]        # default OUT runs/multi30k_ensemble
#
# Rerun the same command to resume after an interruption: each member continues from its last.ckpt, and
# Lightning's Timer, saved there, keeps counting MAX_TIME from where it stopped. Environment: PYTHON
# (default .venv/bin/python), MAX_TIME (default 00:01:58:00, leaving two minutes of the two hours for
# averaging). Figures: OUT/test_ensemble.json and OUT/{a,b}/test.json (benchmarks/translate_bleu.py keys).
set -euo pipefail
OUT=${1:-runs/multi30k_ensemble}
PY=${PYTHON:-.venv/bin/python}
MAX_TIME=${MAX_TIME:-00:01:58:00}
ISQRT=(--model.schedule inverse_sqrt --model.warmup_steps 2000 --model.weight_decay 0.0
       --trainer.gradient_clip_val null)

member() {  # NAME FIT_ARGS...: train (or resume) one member in OUT/NAME, then average its last 10 checkpoints
  local name=$1 dir=$OUT/$1
  shift
  mkdir -p "$dir"
  sed "s#runs/multi30k_en_de#$dir#g" configs/translate/multi30k_en_de.yaml > "$dir/config.yaml"
  local resume=()
  if [ -e "$dir/checkpoints/last.ckpt" ]; then resume=(--ckpt_path "$dir/checkpoints/last.ckpt"); fi
  echo "$(date) member $name: fit ${resume[*]}" >> "$dir/fit.log"
  OMP_NUM_THREADS=1 "$PY" -m translate fit --config "$dir/config.yaml" "$@" --trainer.max_epochs 400 \
    --trainer.max_time "$MAX_TIME" --trainer.enable_progress_bar false "${resume[@]}" >> "$dir/fit.log" 2>&1
  echo "$(date) member $name: fit done" >> "$dir/fit.log"
  OMP_NUM_THREADS=1 "$PY" -m translate.average --dir "$dir/checkpoints/recent" --last 10 --output "$dir/avg.ckpt"
}

start=$(date +%s)
member a "${ISQRT[@]}" --seed_everything 1 & a=$!
member b "${ISQRT[@]}" --seed_everything 2 --trainer.accumulate_grad_batches 2 & b=$!
wait $a
wait $b
echo "training and averaging: $(( $(date +%s) - start )) s in this process (see OUT/*/fit.log for the whole run)"
for name in a b; do
  "$PY" benchmarks/translate_bleu.py --ckpt "$OUT/$name/avg.ckpt" --json "$OUT/$name/test.json"
done
"$PY" benchmarks/translate_bleu.py --ckpt "$OUT/a/avg.ckpt" "$OUT/b/avg.ckpt" --out "$OUT/test_2016_flickr.ensemble.de" \
  --json "$OUT/test_ensemble.json"
