"""The examples under examples/, run as a user runs them: a shell script calling the
`transformer` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import sacrebleu

REPO = Path(__file__).resolve().parents[1]
OWN_DATA = REPO / "examples" / "own_data"


def test_the_own_data_example_trains_translates_and_scores(tmp_path):
    """examples/own_data/run.sh, given a budget of 24,000 target tokens so that it takes
    seconds (the same command with no override trains for its default budget): it trains on
    the example's files until the budget is used, the training loss falls, and it writes a
    translation of each test line and the scores sacreBLEU gives them."""
    run = tmp_path / "runs" / "own"
    env = {**os.environ, "RUN_DIR": str(run), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(OWN_DATA / "run.sh"),
                             "trainer.max_target_tokens=24000", "trainer.precision=fp32",
                             "trainer.log_every_updates=5"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    log = (run / "train.log").read_text()
    assert "stopped (max_target_tokens)" in log and "| plan: " in log
    losses = [float(line.split("| loss ")[1].split(" |")[0])
              for line in log.splitlines() if "| loss " in line]
    assert len(losses) >= 2 and losses[-1] < losses[0] - 1.0
    hyps = (run / "test.hyp.de").read_text(encoding="utf-8").split("\n")[:-1]
    refs = (OWN_DATA / "data" / "test.de").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == len(refs) == 200
    output = result.stdout + result.stderr
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    assert f"BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__} = " \
           f"{bleu.score:.1f}" in output
