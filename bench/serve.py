"""How does the translation server hold up under load: its latency and throughput with 1, 8
and 32 concurrent clients (CPU), and its memory over time?

    python bench/serve.py [--checkpoint runs/ref] [--clients 1 8 32] [--max-requests 2000]
        [--max-seconds 60] [--threads 1] [--workers 0] [--source .../test_2016_flickr.en.gz]
        [--ctranslate2]

Starts scripts/serve.py on a free 127.0.0.1 port, then for each setting runs that many
clients, each sending single sentences of test_2016_flickr (en) to POST /translate one after
another over a kept-alive connection, until --max-requests answers or --max-seconds (the
run stops by itself). A warm-up runs every setting briefly first (4 requests per client, not
counted), so the measured run starts with the server's working set for every batch size
(RSS "start" is before it). Prints per setting: requests, errors (any answer other than a 200
with one translation), p50/p95 latency, sentences/s and the mean batch the server formed (its
/health counters); then the 32-vs-1 throughput ratio (target >= 5x: concurrent clients
share batches) and the server's RSS at the start (loaded, idle), at the end of the first
quarter of the measured requests and at the end (target: <= 5% growth from the quarter to
the end). The server's RSS is read from /proc (Linux).

`--ctranslate2`: then the same server on a CTranslate2 float32 export of the checkpoint
(`--engine ctranslate2`, exported here, a server process of its own) answers one client's
single sentences the same way, after the same warm-up: its p50/p95 latency and sentences/s
beside ours at 1 client, and ours / CTranslate2 (target: at least `TARGET_SINGLE`x its
sentences/s, its median latency at most 1 / `TARGET_SINGLE` of ours).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from timing import percentile, status_mib

from transformer.data.text import read_lines

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.en.gz"
TARGET_RATIO, TARGET_RSS_GROWTH = 5.0, 0.05
TARGET_SINGLE = 0.5  # ours / CTranslate2, one client sending single sentences


@dataclass
class Setting:
    """One load setting's measurements."""

    clients: int
    latencies: list[float] = field(default_factory=list)  # seconds, successful requests
    errors: int = 0
    seconds: float = 0.0
    batches: int = 0  # formed by the server during the setting
    sentences: int = 0

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds


class RssMonitor:
    """The server's RSS, sampled every 50 ms, with how many measured requests were done."""

    def __init__(self, pid: int):
        self.pid, self.done, self.samples = pid, 0, []  # samples: (requests done, MiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss_mib(self) -> float:
        return status_mib("VmRSS", self.pid)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append((self.done, self.rss_mib()))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((self.done, self.rss_mib()))

    def at(self, requests: int) -> float:
        """RSS when `requests` measured requests had been answered (the first sample after)."""
        return next(mib for done, mib in self.samples if done >= requests)


def start_server(args: argparse.Namespace, port: int, log: Path, model: Path | None = None,
                 engine: str = "torch") -> subprocess.Popen:
    """scripts/serve.py on `port` (`model`, default --checkpoint, on `engine`), its output in
    `log`; returns once /health answers."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, str(ROOT / "scripts" / "serve.py"), "--checkpoint",
               str(model or args.checkpoint), "--engine", engine, "--port", str(port),
               "--threads", str(args.threads), "--device", "cpu",
               *(["--workers", str(args.workers)] if args.workers and engine == "torch" else [])]
    with open(log, "w") as output:
        server = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"error: the server exited: {log.read_text().strip()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    sys.exit("error: the server did not start within 120 s")


def health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as response:
        return json.load(response)


def run_setting(port: int, sentences: list[str], clients: int, max_requests: int,
                max_seconds: float, monitor: RssMonitor | None) -> Setting:
    """`clients` threads sending one sentence per request until `max_requests` answers or
    `max_seconds`; with `monitor`, the answers are counted for the RSS timeline."""
    setting = Setting(clients)
    lock = threading.Lock()
    counter = iter(range(max_requests))
    deadline = time.monotonic() + max_seconds

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while time.monotonic() < deadline:
            with lock:
                index = next(counter, None)
            if index is None:
                break
            body = json.dumps({"text": [sentences[index % len(sentences)]]})
            start = time.perf_counter()
            try:
                connection.request("POST", "/translate", body,
                                   {"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = json.loads(response.read())
                ok = response.status == 200 and len(answer["translations"]) == 1
            except (OSError, http.client.HTTPException, ValueError, KeyError):
                ok = False
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            elapsed = time.perf_counter() - start
            with lock:
                if ok:
                    setting.latencies.append(elapsed)
                else:
                    setting.errors += 1
                if monitor is not None:
                    monitor.done += 1
        connection.close()

    before = health(port)
    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    setting.seconds = time.perf_counter() - start
    after = health(port)
    setting.batches = after["batches"] - before["batches"]
    setting.sentences = after["sentences"] - before["sentences"]
    return setting


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ctranslate2_single(args: argparse.Namespace, sentences: list[str], folder: Path) -> Setting:
    """One client's single sentences against the server on a CTranslate2 float32 export of
    --checkpoint (made in `folder`), after the warm-up the main run gives 1 client."""
    from transformer.decoding.translator import Translator
    from transformer.deploy.export import export_ctranslate2

    export = folder / "ct2-float32"
    export_ctranslate2(Translator.load(args.checkpoint, device="cpu"), export)
    port = free_port()
    server = start_server(args, port, folder / "ct2-server.log", export, "ctranslate2")
    try:
        run_setting(port, sentences, 1, 4, args.max_seconds, None)
        return run_setting(port, sentences, 1, args.max_requests, args.max_seconds, None)
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, default=ROOT.parent / "runs" / "ref")
    p.add_argument("--source", type=Path, default=SHARED,
                   help="sentences to send (default: ../shared/data/multi30k's test_2016_flickr)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--max-requests", type=int, default=2000, help="per setting")
    p.add_argument("--max-seconds", type=float, default=60.0, help="per setting")
    p.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    p.add_argument("--workers", type=int, default=0,
                   help="the server's search processes (`transformer serve --workers`)")
    p.add_argument("--ctranslate2", action="store_true",
                   help="also one client against the server on a CTranslate2 export")
    args = p.parse_args()
    sentences = [line for line in read_lines(args.source) if line.strip()]
    port = free_port()
    folder = Path(tempfile.mkdtemp())
    log = folder / "server.log"
    server = start_server(args, port, log)
    try:
        monitor = RssMonitor(server.pid)
        rss_start = monitor.rss_mib()
        monitor.start()
        for clients in args.clients:  # warm-up: every batch size once, before measuring
            run_setting(port, sentences, clients, 4 * clients, args.max_seconds, None)
        settings = [run_setting(port, sentences, clients, args.max_requests, args.max_seconds,
                                monitor) for clients in args.clients]
        monitor.stop()
    finally:
        server.terminate()
        server.wait(timeout=30)
    report(args, settings, monitor, rss_start)
    ours = next((s for s in settings if s.clients == 1), None)
    if args.ctranslate2 and ours is not None:
        report_single(ours, ctranslate2_single(args, sentences, folder))


def report_single(ours: Setting, theirs: Setting) -> None:
    """One client's single sentences: ours against the CTranslate2 server."""
    for name, s in (("ours", ours), ("CTranslate2", theirs)):
        print(f"one client, single sentences, {name}: p50 {1000 * percentile(s.latencies, 50):.1f}"
              f" ms, p95 {1000 * percentile(s.latencies, 95):.1f} ms, {s.throughput:.1f} "
              f"sent/s, {s.errors} errors")
    ratio = ours.throughput / theirs.throughput
    print(f"{'PASS' if ratio >= TARGET_SINGLE else 'FAIL'}  ours >= {TARGET_SINGLE:g}x "
          f"CTranslate2 behind the same server, one client: {ratio:.2f}x")


def report(args: argparse.Namespace, settings: list[Setting], monitor: RssMonitor,
           rss_start: float) -> None:
    print(f"server: {args.checkpoint}, {args.threads} torch thread(s), beam = the "
          f"checkpoint's default; one test sentence per request")
    print(f"{'clients':>7} {'requests':>8} {'errors':>6} {'p50 ms':>7} {'p95 ms':>7} "
          f"{'sent/s':>7} {'mean batch':>10}")
    for s in settings:
        lat = s.latencies or [float("nan")]
        print(f"{s.clients:>7} {len(s.latencies) + s.errors:>8} {s.errors:>6} "
              f"{1000 * percentile(lat, 50):>7.1f} {1000 * percentile(lat, 95):>7.1f} "
              f"{s.throughput:>7.1f} {s.sentences / max(s.batches, 1):>10.1f}")
    by_clients = {s.clients: s for s in settings}
    if 1 in by_clients and 32 in by_clients:
        ratio = by_clients[32].throughput / by_clients[1].throughput
        errors = by_clients[32].errors
        met = ratio >= TARGET_RATIO and errors == 0
        print(f"32-vs-1 throughput: {ratio:.1f}x, {errors} errors at 32 clients "
              f"(target >= {TARGET_RATIO:g}x, 0 errors: {'met' if met else 'MISSED'})")
    total = monitor.done
    quarter, end = monitor.at(total // 4), monitor.samples[-1][1]
    growth = end / quarter - 1
    print(f"server RSS: start {rss_start:.1f} MiB, end of first quarter {quarter:.1f} MiB, "
          f"end {end:.1f} MiB: {100 * growth:+.1f}% from the quarter to the end "
          f"(target <= {100 * TARGET_RSS_GROWTH:g}%: "
          f"{'met' if growth <= TARGET_RSS_GROWTH else 'MISSED'})")


if __name__ == "__main__":
    main()
