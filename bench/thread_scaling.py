"""Benchmark: how our engine's beam search scales from one CPU thread to two, in one process
(two threads, `decode_batches` searching two batches at once) and in two processes of one
thread each (every other input each): if the two processes scale better, the threads lose
to what they share in one process (the Python interpreter); if not, to what the cores share.

Each arrangement is timed from a start signal given once every process has loaded the model
and warmed up, the arrangements in turn, `--rounds` times; the medians count.

    python bench/thread_scaling.py --checkpoint CKPT --data-root DIR [--join 4]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from engines import DEFAULT_CHECKPOINT, cpu_description  # bench/engines.py

from transformer.multi30k import DEFAULT_ROOT

# One process: load, warm up, say "ready", wait for a line, translate its share of the inputs.
CHILD = r"""
import sys, torch
from transformer.text import read_lines
from transformer.translator import Translator
checkpoint, root, join, threads, share = sys.argv[1:6]
torch.set_num_threads(int(threads))
translator = Translator.load(checkpoint, device="cpu")
lines = read_lines(f"{root}/test_2016_flickr.en.gz")
inputs = [" ".join(lines[i:i + int(join)]) for i in range(0, len(lines), int(join))]
inputs = inputs if share == "all" else inputs[int(share)::2]
translator.translate(inputs[:20], beam_size=5)
print("ready", flush=True)
sys.stdin.readline()
translator.translate(inputs, beam_size=5)
print("done", flush=True)
"""

ARRANGEMENTS = {"1 thread": [(1, "all")], "2 threads": [(2, "all")],
                "2 processes": [(1, "0"), (1, "1")]}


def timed(args: argparse.Namespace, processes: list[tuple[int, str]]) -> float:
    """Seconds from the start signal until every process has translated its share."""
    children = [subprocess.Popen([sys.executable, "-c", CHILD, args.checkpoint, args.data_root,
                                  str(args.join), str(threads), share],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for threads, share in processes]
    for child in children:
        if child.stdout.readline().strip() != "ready":
            raise SystemExit(f"a translating process failed (exit {child.wait()})")
    start = time.perf_counter()
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        child.stdout.readline()
        child.wait()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT)
    parser.add_argument("--data-root", default=DEFAULT_ROOT)
    parser.add_argument("--join", type=int, default=1,
                        help="translate every N consecutive test lines as one input")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(cpu_description())
    times: dict[str, list[float]] = {name: [] for name in ARRANGEMENTS}
    for _ in range(args.rounds):
        for name, processes in ARRANGEMENTS.items():
            times[name].append(timed(args, processes))
    one = statistics.median(times["1 thread"])
    for name, seconds in times.items():
        print(f"inputs of {args.join} line(s), beam 5, float32, {name:<11}: median "
              f"{statistics.median(seconds):.2f}s, {one / statistics.median(seconds):.2f}x one "
              f"thread (runs: {', '.join(f'{s:.2f}s' for s in seconds)})")


if __name__ == "__main__":
    main()
