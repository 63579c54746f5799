#!/bin/bash
# Does the CUDA path work on a GPU machine, end to end? One script: bench/cuda_check.py's
# comparisons, then a short bf16 training run of the recipe and beam-5 translation of the
# test set on the GPU.
#
#   bash bench/cuda_check.sh DATA_DIR [CHECKPOINT CPU_HYP ALPHA]
#
# DATA_DIR holds the Multi30k files (raw, and tok/); CHECKPOINT with CPU_HYP (its CPU
# translations of test_2016_flickr.en at ALPHA) adds the check that the GPU reproduces them.
# Logs go to $OUT when set (the device tool's output folder), else to runs/cuda_check.
# On a GPU machine whose image lacks hydra-core and sacremoses, carry the kit of
# bench/gpu/kit.sh (.gpu/) and first run: python3 -m pip install -q --no-index --no-deps
# --target /tmp/site .gpu/wheels/*.whl && export PYTHONPATH=/tmp/site; DATA_DIR .gpu/multi30k
set -u
DATA=$1
LOGS=${OUT:-runs/cuda_check}
RUN=/tmp/cuda_check_run
mkdir -p "$LOGS"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi -L
gunzip -c "$DATA/test_2016_flickr.en.gz" > /tmp/test.en
gunzip -c "$DATA/test_2016_flickr.de.gz" > /tmp/test.de

extra=()
if [ $# -ge 4 ]; then extra=(--checkpoint "$2" --src /tmp/test.en --hyp "$3" --alpha "$4"); fi
# ${extra[@]+...}: an empty array is safe under set -u
python3 bench/cuda_check.py ${extra[@]+"${extra[@]}"} 2>&1 | tee "$LOGS/cuda_check.txt"
status=${PIPESTATUS[0]}

# Two minutes of the recipe's training on the GPU under bf16 autocast (the recipe itself
# trains Transformer-Tiny in float32, which is faster there: README).
rm -rf "$RUN"
python3 scripts/train.py data.root="$DATA" trainer.max_time=120 optim.cooldown_updates=0 \
    trainer.max_updates=8000 trainer.precision=bf16 hydra.run.dir="$RUN" > "$LOGS/train.out" 2>&1
grep -E "device|stopped|valid loss" "$RUN/train.log" | tail -6
cp "$RUN/train.log" "$LOGS/train.log"
python3 scripts/translate.py --checkpoint "$RUN" --device cuda --input /tmp/test.en \
    --output "$LOGS/test.hyp" --beam-size 5 --reference /tmp/test.de \
    --paper-protocol "$DATA/tok/test_2016_flickr.lc.norm.tok.de" 2>&1 | grep -v "sent/s" \
    | tee "$LOGS/translate.txt"
exit "$status"
