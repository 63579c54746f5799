#!/bin/bash
# Fills .gpu/ (git-ignored) with what a GPU machine without network needs to run
# bench/gpu/run.sh: wheels of the runtime packages its image lacks (bench/gpu/closure.py,
# pure-Python wheels; antlr4-python3-runtime 4.9.3 exists only as an sdist and is built
# here) and the Multi30k files of the recipe. Prints the kit's size and the device call.
#
#   bash bench/gpu/kit.sh [DATA_DIR]      (default: $MULTI30K_DIR, else ../shared/data/multi30k)
#
# Run it where the package is installed with its paper extra (pip install -e '.[paper]'),
# with access to the package index. DATA_DIR holds Multi30k's raw files and tok/
# (transformer.data.multi30k.download_multi30k(DIR, ("en", "de"), tokenized=True)).
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-${MULTI30K_DIR:-../shared/data/multi30k}}
KIT=.gpu
PY=${PYTHON:-python3}
FILES=(train.en.gz train.de.gz val.en.gz val.de.gz test_2016_flickr.en.gz
       test_2016_flickr.de.gz tok/test_2016_flickr.lc.norm.tok.de)

for f in "${FILES[@]}"; do
    [ -f "$DATA/$f" ] || { echo "error: $DATA/$f is missing: DATA_DIR must hold Multi30k's" \
        "raw files and tok/ (bash bench/gpu/kit.sh DATA_DIR)" >&2; exit 1; }
done
packages=$("$PY" bench/gpu/closure.py)
for name in torch nvidia- triton; do
    if grep -q "^$name" <<< "$packages"; then
        echo "error: the kit would hold $name, which the GPU machine has" >&2; exit 1
    fi
done

rm -rf "$KIT"
mkdir -p "$KIT/wheels" "$KIT/multi30k/tok"
# shellcheck disable=SC2086  # one requirement a word
"$PY" -m pip wheel -q --no-deps --wheel-dir "$KIT/wheels" $packages
for wheel in "$KIT"/wheels/*.whl; do
    case $wheel in
        *-py3-none-any.whl | *-py2.py3-none-any.whl) ;;
        *) echo "error: $wheel is not a pure-Python wheel: it may not install on the GPU" \
               "machine's Python 3.12" >&2; exit 1 ;;
    esac
done
for f in "${FILES[@]}"; do cp "$DATA/$f" "$KIT/multi30k/$f"; done

size=$(du -sm "$KIT" | cut -f1)
if [ "$size" -ge 48 ]; then
    echo "error: the kit is $size MiB; a device call carries at most 64 MiB" >&2; exit 1
fi
echo "kit: $(du -sh "$KIT" | cut -f1) in $KIT/ (a device call carries at most 64 MiB)"
(cd "$KIT" && find . -type f | sort | sed 's|^\./|  |')
cat <<'EOF'
device call (one NVIDIA H200, 9 minutes of script; the same call again resumes the training):
  command:   bash bench/gpu/run.sh
  carry:     [".gpu"]
  timeout_s: 590
a second call within the machine's warm period (its run directory lives there) gives the
script the device time that is left, e.g.:
  command:   BUDGET_S=180 bash bench/gpu/run.sh
EOF
