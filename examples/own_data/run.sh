#!/usr/bin/env bash
# Train a translation model on your own parallel files, translate a test set with it and
# score the translations: the whole path, on the small English-German corpus in data/.
#
#   bash examples/own_data/run.sh                      # the default budget (8 minutes on 2 cores of a Xeon with AMX)
#   bash examples/own_data/run.sh trainer.max_time=120 # any training override: 2 minutes
#
# Replace the six files of data/ by yours: UTF-8 text, one sentence per line, the source
# and target files line by line aligned. SentencePiece is trained for you.
# The run goes to runs/own under the current directory (RUN_DIR=... to change it).
set -euo pipefail
data=$(dirname "$0")/data
run=${RUN_DIR:-runs/own}

transformer train data=files \
    data.train_src="$data/train.en" data.train_tgt="$data/train.de" \
    data.valid_src="$data/valid.en" data.valid_tgt="$data/valid.de" \
    hydra.run.dir="$run" "$@"

transformer translate --checkpoint "$run" --input "$data/test.en" --output "$run/test.hyp.de" \
    --reference "$data/test.de"
