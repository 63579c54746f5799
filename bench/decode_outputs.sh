#!/usr/bin/env bash
# Does a change leave every output byte-identical? Every decoding mode of `transformer
# translate`, in both engines, written to one folder: run it with two versions of the package
# and `diff -r` the folders.
#
#   bash bench/decode_outputs.sh CHECKPOINT EXPORT_DIR SOURCE REFERENCE OUT_DIR
#
# CHECKPOINT: a .pt file or run directory; EXPORT_DIR: its `transformer export` (CTranslate2);
# SOURCE/REFERENCE: e.g. test_2016_flickr.en/.de (plain text). The prefixes are the first two
# words of every other reference line. Sampling runs on one thread, where both engines repeat
# their draws for a seed. QUANTIZE=int8 runs our engine in int8 (`--quantize int8`; give an
# int8 export as EXPORT_DIR for CTranslate2's). torch.workers2.txt (2 search processes) is
# torch.threads2.txt (2 threads) where both search the same batches (the whole file: every
# batch one thread's or one process's, one thread each).
set -euo pipefail
checkpoint=$1 export_dir=$2 source=$3 reference=$4 out=$5
mkdir -p "$out"
awk 'NR % 2 { print $1 " " $2; next } { print "" }' "$reference" > "$out/prefixes.txt"
translate() { python -m transformer translate --input "$source" "$@" 2>>"$out/stderr.txt"; }
quantized=()
[ -n "${QUANTIZE:-}" ] && quantized=(--quantize "$QUANTIZE")
for engine in torch ctranslate2; do
    model=$checkpoint options=("${quantized[@]}")
    [ "$engine" = ctranslate2 ] && model=$export_dir options=()
    run() { local name=$1; shift; echo "== $engine $name" >>"$out/stderr.txt"
            translate --engine "$engine" --checkpoint "$model" --threads 1 "${options[@]}" "$@" \
                > "$out/$engine.$name.txt"; }
    run beam5 --beam-size 5
    run nbest3 --beam-size 5 --nbest 3
    run greedy --beam-size 1 --alpha 0
    run sampling --sampling-topk 10 --temperature 0.8 --seed 7
    run prefix --prefix "$out/prefixes.txt"
    run alignment --alignment
    run score --reference "$reference" --score
done
run() { local name=$1; shift; echo "== torch $name" >>"$out/stderr.txt"
        translate --engine torch --checkpoint "$checkpoint" --threads 1 "${quantized[@]}" "$@" \
            > "$out/torch.$name.txt"; }
run alignment-head --alignment --alignment-layer 2 --alignment-head 1
run sampling-topp --sampling-topp 0.9 --seed 3 --nbest 1
run threads2 --threads 2 --nbest 2
run workers2 --threads 2 --workers 2 --nbest 2
tr '\r' '\n' < "$out/stderr.txt" | grep -E '^(==|decoding|scoring|error|WARNING)' \
    > "$out/messages.txt" || true
rm "$out/stderr.txt"
wc -l "$out"/*.txt | tail -1
