#!/bin/bash
# Wu et al. (2021)'s Multi30k recipe at their own budget on one GPU, then the base model's
# training throughput: one script, meant for a lent GPU machine.
#
#   bash bench/gpu_recipe.sh DATA_DIR [RUN_DIR]
#
# 1. trains configs/experiment/multi30k_paper.yaml (8,000 updates of ~8,192 target tokens);
#    started again, it resumes from RUN_DIR/checkpoints/checkpoint_last.pt and goes on;
# 2. chooses, on validation, the length penalty for the average of the last 10 epoch
#    checkpoints (scripts/tune_decoding.py) and translates test_2016_flickr with it: cased
#    sacreBLEU, chrF and the paper protocol (BLEU against the dataset's tokenized reference);
# 3. times the base model's training step (d512, 6+6 layers, FFN 2048, 8 heads) at 16k tokens
#    in float32 and bf16 autocast, against torch.nn.Transformer of the same dimensions
#    (bench/train_speed.py), printing tokens/s for each.
#
# DATA_DIR holds the raw Multi30k files and tok/ (transformer.multi30k.download_multi30k(DIR,
# ("en", "de"), tokenized=True)). Logs go to $OUT when set (the device tool's output folder),
# else to RUN_DIR. A dry run on a CPU, a handful of updates (as the tests do):
#   DEVICE=cpu EXTRA="trainer.max_updates=4 trainer.validate_after_updates=2 \
#     data.max_train_pairs=300 data.max_tokens=1024" LAST=1 SIZE=tiny MAX_TOKENS=1024 STEPS=1 \
#     bash bench/gpu_recipe.sh DATA_DIR runs/gpu_recipe_dry
set -euo pipefail
DATA=$1
RUN=${2:-runs/multi30k_paper}
DEVICE=${DEVICE:-cuda}
LOGS=${OUT:-$RUN}
mkdir -p "$RUN" "$LOGS"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ "$DEVICE" = cpu ] || nvidia-smi -L

start=$SECONDS
# shellcheck disable=SC2086  # EXTRA is a list of overrides
python scripts/train.py experiment=multi30k_paper data.root="$DATA" trainer.device="$DEVICE" \
    hydra.run.dir="$RUN" ${EXTRA:-} 2> >(grep -v "update/s\|it/s" >&2) | tee -a "$LOGS/train.out"
grep "valid loss\|stopped" "$RUN/train.log" | tail -12
echo "training: $((SECONDS - start)) s of wall time in this call"

start=$SECONDS
python scripts/tune_decoding.py "$RUN" -o "$RUN/chosen.pt" --last "${LAST:-10}" \
    --alpha 0.6 1.0 1.4 2.0 --beam-size 5 --device "$DEVICE" | tee "$LOGS/tune_decoding.out"
gunzip -c "$DATA/test_2016_flickr.en.gz" > "$RUN/test.en"
gunzip -c "$DATA/test_2016_flickr.de.gz" > "$RUN/test.de"
python scripts/translate.py --checkpoint "$RUN/chosen.pt" --input "$RUN/test.en" \
    --output "$LOGS/test.hyp" --reference "$RUN/test.de" --device "$DEVICE" \
    --paper-protocol "$DATA/tok/test_2016_flickr.lc.norm.tok.de" 2>&1 | grep -v "sent/s" \
    | tee "$LOGS/test_scores.out"
echo "choosing alpha and translating: $((SECONDS - start)) s"

start=$SECONDS
python bench/train_speed.py --device "$DEVICE" --sizes "${SIZE:-base}" \
    --max-tokens "${MAX_TOKENS:-16384}" --bf16 --no-memory --steps "${STEPS:-10}" \
    --data-root "$DATA" | tee "$LOGS/base_speed.out"
echo "base-model timing: $((SECONDS - start)) s"
