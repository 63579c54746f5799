#!/bin/bash
# One script for a GPU machine without network (an NVIDIA H200; its image has PyTorch but
# not hydra-core, omegaconf, antlr4 or sacremoses): installs the kit that bench/gpu/kit.sh
# put in .gpu/, then, in order of value, each step logged and run even if an earlier failed:
#  (a) the training-throughput table (bench/train_speed.py, ~1 minute): tiny and base, ours
#      vs nn.Transformer, float32 / TF32 / bf16, cuDNN attention on and off, with tokens/s,
#      MFU and peak GPU memory;
#  (b) Wu et al.'s recipe (experiment=multi30k_paper, 8,000 updates) in runs/gpu_paper under
#      a trainer.max_time that leaves room for (c) within BUDGET_S; started again on the
#      same machine, it resumes there and raises max_time by what this call can spend;
#  (c) once training has stopped at its 8,000 updates: checkpoint average and length penalty
#      on validation (scripts/tune_decoding.py), then test_2016_flickr with cased sacreBLEU
#      and the paper protocol (scripts/translate.py).
# Copies run.log, speed.txt, train.log, eval.txt, test.hyp and chosen.pt to $OUT. Its last
# line says what is left for a second call.
#
#   bash bench/gpu/run.sh                  the device call: carry [".gpu"], timeout_s 590
#   BUDGET_S=180 bash bench/gpu/run.sh     a second call on the same (still warm) machine
#   GPU_DRY_RUN=1 bash bench/gpu/run.sh    the same steps at toy size on a CPU
#                                          (bench/gpu/rehearse.sh runs it as the GPU would)
# Environment: OUT (default runs/gpu_out; dry run .gpu-rehearsal/out), BUDGET_S (seconds this
# script may take, default 540), TABLE=0 (skip (a), leaving its time to training), EXTRA
# (more training overrides), TRAIN_S (seconds of training in this call instead of what the
# budget leaves).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit
KIT=$PWD/.gpu
if [ ! -d "$KIT/wheels" ] || [ ! -f "$KIT/multi30k/train.en.gz" ]; then
    echo "error: $KIT is missing or incomplete: build it with bash bench/gpu/kit.sh, and name" \
        "it in the device call's carry ([\".gpu\"])" >&2
    exit 2
fi
DATA=$KIT/multi30k
BUDGET=${BUDGET_S:-540}
if [ "${GPU_DRY_RUN:-0}" = 1 ]; then
    DEVICE=cpu RUN=.gpu-rehearsal/run OUT=${OUT:-.gpu-rehearsal/out} UPDATES=12 LAST=1
    ALPHAS=(0.6 1.0) RESERVE=120 OVERHEAD=120
    SPEED=(--sizes tiny --max-tokens 1024 --steps 1 --warmup 1 --no-memory)
    TRAIN=(data.max_train_pairs=300 data.vocab_size=1000 data.max_tokens=1024
           trainer.max_updates=12 trainer.validate_after_updates=6)
else
    DEVICE=cuda RUN=runs/gpu_paper OUT=${OUT:-runs/gpu_out} UPDATES=8000 LAST=10
    ALPHAS=(0.6 1.0 1.4 2.0) RESERVE=90 OVERHEAD=60  # (c); training's start and last save
    SPEED=(--sizes tiny base --max-tokens 8192 16384 --steps 8 --warmup 3)
    TRAIN=()
fi
mkdir -p "$RUN" "$OUT"
SITE=${TMPDIR:-/tmp}/transformer-gpu-site
export PYTHONPATH=src:$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
SUMMARY=()

step() {  # step NAME COMMAND...: run it, print and record its exit status and time
    local name=$1 start=$SECONDS rc
    shift
    echo "== $name ($SECONDS s into the script)"
    "$@"
    rc=$?
    SUMMARY+=("$(printf '%-42s exit %3d, %4d s' "$name" "$rc" $((SECONDS - start)))")
    echo "== $name: exit $rc after $((SECONDS - start)) s"
}

setup() {
    rm -rf "$SITE"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
        "$KIT"/wheels/*.whl || return
    python3 -c "import torch, hydra, omegaconf, sacremoses
print('torch', torch.__version__, '|', torch.cuda.get_device_name() if torch.cuda.is_available()
      else 'no CUDA device', '| hydra', hydra.__version__, '| omegaconf', omegaconf.__version__)"
}

speed() {
    if [ -f "$RUN/speed.txt" ]; then echo "done in an earlier call"; return; fi
    if [ "${TABLE:-1}" = 0 ]; then echo "skipped (TABLE=0)"; return; fi
    # at most 3 minutes: a slow table must not take the training's time
    timeout -k 10 180 python3 bench/train_speed.py --device "$DEVICE" "${SPEED[@]}" --tf32 \
        --bf16 --cudnn-attention both --data-root "$DATA" | tee "$RUN/speed.part" \
        && mv "$RUN/speed.part" "$RUN/speed.txt"
}

progress() {  # "updates train_seconds" of the run's checkpoint_last.pt, "0 0" without one
    local ckpt=$RUN/checkpoints/checkpoint_last.pt
    [ -f "$ckpt" ] || { echo "0 0"; return; }
    python3 -c "import sys, torch
s = torch.load(sys.argv[1], map_location='cpu', weights_only=True)['train_state']
print(s['num_updates'], round(s['train_time']))" "$ckpt" 2>/dev/null || echo "0 0"
}

trained() {  # has the run stopped at its last update?
    grep "stopped (" "$RUN/train.log" 2>/dev/null | tail -1 \
        | grep -q "stopped (max_updates) in epoch [0-9]* after $UPDATES updates"
}

train() {
    if trained; then echo "done in an earlier call"; return; fi
    local updates seconds allowance rc lines
    read -r updates seconds < <(progress)
    lines=$(cat "$RUN/train.log" 2>/dev/null | wc -l)
    allowance=${TRAIN_S:-$((BUDGET - SECONDS - RESERVE - OVERHEAD))}
    if [ -z "${TRAIN_S:-}" ] && [ "$allowance" -lt 20 ]; then
        echo "only $allowance s left for training in this call: skipped"
        return 1
    fi
    # trainer.max_time counts the training time of every resumed run together
    echo "from update $updates ($seconds s trained): trainer.max_time=$((seconds + allowance))"
    # shellcheck disable=SC2086  # EXTRA: a list of overrides
    timeout -k 30 $((allowance + OVERHEAD)) python3 scripts/train.py experiment=multi30k_paper \
        data.root="$DATA" trainer.device="$DEVICE" hydra.run.dir="$RUN" \
        trainer.max_time=$((seconds + allowance)) "${TRAIN[@]}" ${EXTRA:-} \
        >> "$RUN/train.out" 2>&1
    rc=$?
    tail -n +$((lines + 1)) "$RUN/train.log" | sed 's/, ModelConfig(.*//' \
        | grep -E "\| (model |device|CUDA|resumed|stopped)|valid loss" | tail -8
    [ "$rc" = 0 ] || tail -20 "$RUN/train.out"
    return "$rc"
}

evaluate() {
    python3 scripts/tune_decoding.py "$RUN" -o "$RUN/chosen.pt" --last "$LAST" \
        --alpha "${ALPHAS[@]}" --beam-size 5 --device "$DEVICE" | tee "$RUN/eval.txt" || return
    gunzip -c "$DATA/test_2016_flickr.en.gz" > "$RUN/test.en"
    gunzip -c "$DATA/test_2016_flickr.de.gz" > "$RUN/test.de"
    python3 scripts/translate.py --checkpoint "$RUN/chosen.pt" --input "$RUN/test.en" \
        --output "$RUN/test.hyp" --reference "$RUN/test.de" --device "$DEVICE" \
        --paper-protocol "$DATA/tok/test_2016_flickr.lc.norm.tok.de" 2>&1 \
        | grep -v "sent/s" | tee -a "$RUN/eval.txt" || return
    touch "$RUN/evaluated"
}

collect() {  # at most 8 files of 16 MiB come back from $OUT
    local f
    for f in speed.txt train.log eval.txt test.hyp chosen.pt; do
        [ ! -f "$RUN/$f" ] || [ "$(du -m "$RUN/$f" | cut -f1)" -ge 16 ] || cp "$RUN/$f" "$OUT/"
    done
    ls -l "$OUT"
}

left() {  # what a second call has to do, on the same machine (it holds the run directory)
    local todo=() updates seconds rate="n/a" need=$((RESERVE + OVERHEAD + 300))
    [ -f "$RUN/speed.txt" ] || [ "${TABLE:-1}" = 0 ] || todo+=("(a), about 90 s")
    if ! trained; then
        read -r updates seconds < <(progress)
        if [ "$updates" -gt 0 ] && [ "$seconds" -gt 0 ]; then
            rate=$(awk -v u="$updates" -v s="$seconds" 'BEGIN { printf "%.1f", u / s }')
            need=$(awk -v u="$updates" -v s="$seconds" -v n="$UPDATES" \
                -v r=$((RESERVE + OVERHEAD)) 'BEGIN { printf "%d", (n - u) * s / u + r }')
        fi
        local what="training from update $updates to $UPDATES at $rate updates/s, then (c)"
        todo+=("$what, about $need s")
    elif [ ! -f "$RUN/evaluated" ]; then
        todo+=("(c), about $((RESERVE + OVERHEAD)) s")
    fi
    if [ ${#todo[@]} = 0 ]; then
        echo "nothing left"
    else
        local IFS=";"
        echo "left for a second call on this machine" \
            "(BUDGET_S=seconds bash bench/gpu/run.sh):${todo[*]/#/ }"
    fi
}

main() {
    echo "bench/gpu/run.sh: device $DEVICE, run $RUN, logs $OUT, budget $BUDGET s"
    step "setup: the kit, torch and the GPU" setup
    step "(a) throughput table" speed
    step "(b) training, experiment=multi30k_paper" train
    if trained && [ ! -f "$RUN/evaluated" ]; then
        step "(c) tune decoding, translate the test set" evaluate
    elif ! trained; then
        echo "== (c) waits for training to reach update $UPDATES"
    fi
    collect
    echo "== summary ($SECONDS s of $BUDGET)"
    printf '%s\n' "${SUMMARY[@]}"
    left
}

main 2>&1 | tee "$OUT/run.log"
