"""How much memory does a training run hold, under which allocator?

    python bench/train_memory.py --data-root DIR [--max-time 120 | --max-updates N]
                                 [--out runs/memory]
                                 [--arms system_1024 system jemalloc_default
                                         jemalloc_ideep_1024 jemalloc tcmalloc]

Each arm runs the README's command, `transformer train data.root=DIR
trainer.max_time=SECONDS` (the Multi30k recipe under a time budget; with `--max-updates`,
`trainer.max_updates=N` instead: every arm the same updates), in a process of its own, one
after the other, and reads the peak resident memory (Linux's VmHWM) and the target tokens it
trained from the last line of its log:

  system_1024       the system's malloc (glibc) and oneDNN's own primitive cache (1,024
                    kernels): the command as it was before it chose its environment
  system            the system's malloc, oneDNN's cache at the tuning table's size
                    (`TRANSFORMER_ALLOCATOR=system`)
  jemalloc_default  libjemalloc.so.2 preloaded with jemalloc's own settings (`MALLOC_CONF`
                    empty), the table's cache
  jemalloc_ideep_1024
                    libjemalloc.so.2 preloaded with the table's settings, but PyTorch's
                    oneDNN bridge (ideep) keeping its default 1,024 computations
                    (`LRU_CACHE_CAPACITY`) where the table keeps `ideep_cache`
  jemalloc          libjemalloc.so.2 preloaded, the table's caches and `jemalloc_conf` (what
                    `transformer train` does where it finds jemalloc)
  tcmalloc          libtcmalloc_minimal.so.4 preloaded, the table's cache

An arm may be named more than once (`--arms jemalloc_default jemalloc jemalloc_default
jemalloc`: alternating, so a slow minute of the machine does not fall on one arm only). An
arm whose library this machine lacks is left out, with a line that says so. Columns: peak
resident memory, target tokens per second of training time (the speed probe's seconds
included) and both as ratios to the first arm run, measured in the same run; the machine's
speed drifts by 10-20% between minutes, so read tokens/s over several runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import cpu_description

from transformer.runtime import (
    IDEEP_CACHE_VARIABLE,
    JEMALLOC_VARIABLE,
    ONEDNN_CACHE_VARIABLE,
    find_allocator,
)

ARMS = ("system_1024", "system", "jemalloc_default", "jemalloc_ideep_1024", "jemalloc",
        "tcmalloc")
LIBRARIES = {"jemalloc_default": "libjemalloc.so.2", "jemalloc_ideep_1024": "libjemalloc.so.2",
             "jemalloc": "libjemalloc.so.2", "tcmalloc": "libtcmalloc_minimal.so.4"}
# What the training environment sets (`runtime.training_environment`): an arm starts without
# them, so each arm's own values or the package's apply.
TRAINING_VARIABLES = ("LD_PRELOAD", ONEDNN_CACHE_VARIABLE, IDEEP_CACHE_VARIABLE,
                      JEMALLOC_VARIABLE)
STOPPED = re.compile(r"stopped \(\w+\) in epoch \d+ after ([\d,]+) updates \(([\d,]+) target "
                     r"tokens\), (\d+) s;.*peak resident memory ([\d.]+) GiB")


def arm_environment(arm: str) -> dict[str, str] | None:
    """The variables arm `arm` adds to the environment, None where its library is missing."""
    if arm == "system_1024":
        return {"TRANSFORMER_ALLOCATOR": "system", ONEDNN_CACHE_VARIABLE: "1024"}
    if arm == "system":
        return {"TRANSFORMER_ALLOCATOR": "system"}
    found = find_allocator(names=(LIBRARIES[arm],))
    if found is None:
        return None
    return {"TRANSFORMER_ALLOCATOR": found,
            **({JEMALLOC_VARIABLE: ""} if arm == "jemalloc_default" else {}),
            **({IDEEP_CACHE_VARIABLE: "1024"} if arm == "jemalloc_ideep_1024" else {})}


def run_arm(arm: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, float]:
    """Train arm `arm` under `env` in a process of its own; its updates, tokens, seconds and
    peak resident memory from the log's last line."""
    run_dir = args.out / arm
    shutil.rmtree(run_dir, ignore_errors=True)  # a run directory with checkpoints resumes
    budget = (f"trainer.max_updates={args.max_updates}" if args.max_updates
              else f"trainer.max_time={args.max_time}")
    command = [sys.executable, "-m", "transformer", "train", f"data.root={args.data_root}",
               budget, f"hydra.run.dir={run_dir}"]
    print("+", " ".join(f"{k}={v}" for k, v in env.items()), " ".join(command[1:]),
          flush=True)
    base = {k: v for k, v in os.environ.items() if k not in TRAINING_VARIABLES}
    done = subprocess.run(command, env={**base, **env}, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{arm}: transformer train failed:\n{done.stderr[-2000:]}")
    found = STOPPED.search((run_dir / "train.log").read_text())
    if found is None:
        sys.exit(f"{arm}: no 'stopped ... peak resident memory' line in {run_dir}/train.log")
    updates, tokens, seconds, gib = found.groups()
    return {"updates": int(updates.replace(",", "")), "tokens": int(tokens.replace(",", "")),
            "seconds": int(seconds), "peak_gib": float(gib)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, required=True,
                        help="Multi30k's files (train/val/test_2016_flickr .LANG.gz)")
    parser.add_argument("--max-time", type=int, default=120,
                        help="each arm's trainer.max_time in seconds")
    parser.add_argument("--max-updates", type=int, default=0,
                        help="each arm's trainer.max_updates instead (the same work)")
    parser.add_argument("--out", type=Path, default=Path("runs/memory"),
                        help="the arms' run directories")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    args = parser.parse_args()
    if sys.platform != "linux":
        sys.exit("the peak resident memory is read from Linux's /proc")
    print(f"{cpu_description()}; the allocator transformer train finds here: "
          f"{find_allocator() or 'none'}")
    results = []
    for arm in args.arms:
        env = arm_environment(arm)
        if env is None:
            print(f"{arm}: left out, {LIBRARIES[arm]} is not on this machine")
            continue
        results.append((arm, run_arm(arm, env, args)))
    if not results:
        return
    first = results[0][1]
    first_speed = first["tokens"] / first["seconds"]
    print(f"\n{'arm':<20} {'peak GiB':>8} {'updates':>8} {'tokens/s':>9} {'memory':>7} "
          f"{'speed':>6}")
    for arm, r in results:
        speed = r["tokens"] / r["seconds"]
        print(f"{arm:<20} {r['peak_gib']:>8.2f} {r['updates']:>8,} {speed:>9,.0f} "
              f"{r['peak_gib'] / first['peak_gib']:>6.2f}x {speed / first_speed:>5.2f}x")


if __name__ == "__main__":
    main()
