#!/bin/bash
# The GPU script's rehearsal on a CPU: bench/gpu/run.sh end to end at toy size
# (GPU_DRY_RUN=1), in a fresh virtual environment that holds only packages of the GPU
# machine's image (bench/gpu/image_packages.txt) and the kit installed as there, so a
# missing import shows here, not on the GPU. Two calls, as on the GPU: the first trains for
# 5 s only (TRAIN_S=5) and stops by trainer.max_time, the second resumes and evaluates.
#
#   bash bench/gpu/kit.sh && bash bench/gpu/rehearse.sh
#
# Everything goes to .gpu-rehearsal/ (git-ignored): venv/, run/, and out1/ and out2/ (each
# call's $OUT).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -d .gpu/wheels ]; then
    echo "error: no kit in .gpu/: run bash bench/gpu/kit.sh first" >&2; exit 1
fi
VENV=.gpu-rehearsal/venv
rm -rf .gpu-rehearsal
python3 -m venv "$VENV"
# torch first (the CPU wheel), then the image's packages that the package and the kit use
"$VENV/bin/python3" -m pip install -q torch==2.13.0
"$VENV/bin/python3" -m pip install -q numpy sentencepiece sacrebleu tensorboard tqdm \
    matplotlib pyyaml packaging regex click joblib
# then leave out what the image lacks (dependencies of newer versions than the image's)
extra=$("$VENV/bin/python3" bench/gpu/closure.py --not-in-image)
if [ -n "$extra" ]; then
    echo "removed from the rehearsal environment, as the GPU machine's image lacks them: $extra"
    # shellcheck disable=SC2086  # a list of names
    "$VENV/bin/python3" -m pip uninstall -q -y $extra
fi
export PATH=$PWD/$VENV/bin:$PATH GPU_DRY_RUN=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
unset PYTHONPATH
echo "---- call 1 (training stops by trainer.max_time)"
OUT=.gpu-rehearsal/out1 TRAIN_S=5 bash bench/gpu/run.sh
echo "---- call 2 (resumes)"
OUT=.gpu-rehearsal/out2 bash bench/gpu/run.sh
