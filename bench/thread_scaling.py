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
import json
import statistics
import subprocess
import sys
import time

from engines import add_input_arguments, cpu_description, hold_to_isa, inputs  # bench/engines.py

# One process: load, read its inputs (a JSON line), warm up, say "ready", wait for a line,
# translate them.
CHILD = r"""
import json, sys, torch
from transformer.decoding.translator import Translator
checkpoint, threads = sys.argv[1:3]
torch.set_num_threads(int(threads))
translator = Translator.load(checkpoint, device="cpu")
sources = json.loads(sys.stdin.readline())
translator.translate(sources[:20], beam_size=5)
print("ready", flush=True)
sys.stdin.readline()
translator.translate(sources, beam_size=5)
print("done", flush=True)
"""

ARRANGEMENTS = {"1 thread": [(1, "all")], "2 threads": [(2, "all")],
                "2 processes": [(1, "0"), (1, "1")]}


def timed(checkpoint: str, sources: list[str], processes: list[tuple[int, str]]) -> float:
    """Seconds from the start signal until every process has translated its share."""
    children = []
    for threads, share in processes:
        child = subprocess.Popen([sys.executable, "-c", CHILD, checkpoint, str(threads)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        child.stdin.write(json.dumps(sources if share == "all" else sources[int(share)::2]) + "\n")
        child.stdin.flush()
        children.append(child)
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
    add_input_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    hold_to_isa(args.isa)
    sources = inputs(args, "en")
    print(cpu_description())
    times: dict[str, list[float]] = {name: [] for name in ARRANGEMENTS}
    for _ in range(args.rounds):
        for name, processes in ARRANGEMENTS.items():
            times[name].append(timed(args.checkpoint, sources, processes))
    one = statistics.median(times["1 thread"])
    for name, seconds in times.items():
        print(f"inputs of {args.join} line(s), beam 5, float32, {name:<11}: median "
              f"{statistics.median(seconds):.2f}s, {one / statistics.median(seconds):.2f}x one "
              f"thread (runs: {', '.join(f'{s:.2f}s' for s in seconds)})")


if __name__ == "__main__":
    main()
