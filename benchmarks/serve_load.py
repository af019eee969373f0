"""Load test of the HTTP servers: dynamic batching against batch size 1, measured in the same run.

Starts `python -m APP.serve` on 127.0.0.1 twice, with --max-batch-size 1 and with dynamic batching
(--max-batch-size 32 --batch-timeout 0.002, the servers' defaults); each time N closed-loop clients (one keep-alive
connection each, the next request sent when the last is answered) send requests for --seconds after a
--warmup. Prints req/s and the p50/p95/p99 latency of both settings and the throughput ratio, and the
CPU time per request of the server's processes and of the clients (from /proc and getrusage), which
says where a request's cost goes; --json writes them as one flat object.

The clients share the server's cores, so they must cost little: by default (--client async) all N
connections are driven by one asyncio thread with pre-encoded requests (the cheapest client).
--client threads runs one http.client thread per connection (several times the CPU); both settings
always use the same client. `--client async threads` measures each server start with both clients in
turn (one server start per setting instead of one per setting and client); the figures then carry the
client's name first (`async_dynamic_rps`, `threads_throughput_ratio`). `--setting dynamic` (or `batch1`)
starts that one server only, for smoke tests: its figures, no ratio.

    python benchmarks/serve_load.py --app streamrec --ckpt runs/streamrec_demo/checkpoints/best.ckpt \\
        --clients 32 --seconds 20 --json runs/serve_load_streamrec.json
    python benchmarks/serve_load.py --app translate --ckpt runs/translate_demo/checkpoints/best.ckpt \\
        --clients 32 --seconds 20 --beam 5

Requests: StreamRec, a history of 5-50 random catalogue items and k=10; Translate, one sentence per
request (lines of --input, or random subwords of the source vocabulary). The clients run on the same
machine as the server and share its cores, in both settings alike.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from _common import print_table, write_json
from rich.console import Console

CLIENTS = ("async", "threads")
SETTINGS = ("batch1", "dynamic")
MAKE_CKPT = {
    "streamrec": "`make demo` writes runs/streamrec_demo/checkpoints/best.ckpt (or: python data/make_streamrec_demo.py "
                 "&& python -m streamrec fit --config configs/streamrec/demo.yaml)",
    "translate": "`make demo` writes runs/translate_demo/checkpoints/best.ckpt (or: python data/make_translate_demo.py "
                 "&& python -m translate fit --config configs/translate/demo.yaml)",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--app", choices=("streamrec", "translate"), default="streamrec")
    p.add_argument("--ckpt", help="the checkpoint to serve (see `make demo`)")
    p.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per setting (default 20)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring (default 2)")
    p.add_argument("--max-batch-size", type=int, default=32, help="the dynamic-batching setting (default 32)")
    p.add_argument("--batch-timeout", type=float, default=0.002, help="its batch timeout, seconds (default 0.002)")
    p.add_argument("--threads", type=int, default=0, help="server torch threads (default: the server's default)")
    p.add_argument("--k", type=int, default=10, help="StreamRec: items per request (default 10)")
    p.add_argument("--beam", type=int, default=5, help="Translate: beam width (default 5)")
    p.add_argument("--input", help="Translate: a text file, one sentence per line (default: random subwords)")
    p.add_argument("--client", nargs="+", choices=CLIENTS, default=["async"],
                   help="async: one asyncio thread drives every connection (default); threads: a thread each; "
                        "several (async threads): each server start is measured with each in turn, figures named "
                        "CLIENT_SETTING_...")
    p.add_argument("--setting", nargs="+", choices=SETTINGS, default=list(SETTINGS),
                   help="the server settings to start, one server each (default both: batch1 dynamic); with one "
                        "there is nothing to compare it with, so no ratio is computed (for smoke tests)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", help="keep the servers' logs here (default: a temporary folder)")
    p.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = p.parse_args(argv)
    for name in ("clients", "max_batch_size", "k", "beam"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if len(set(args.client)) != len(args.client):
        p.error("--client: name each client once")
    if len(set(args.setting)) != len(args.setting):
        p.error("--setting: name each setting once")
    if args.seconds <= 0 or args.warmup < 0:
        p.error("--seconds must be > 0 and --warmup >= 0")
    if args.ckpt is None:
        sys.exit(f"error: --ckpt is required; {MAKE_CKPT[args.app]}")
    if not Path(args.ckpt).is_file():
        sys.exit(f"error: --ckpt {args.ckpt}: no such file; {MAKE_CKPT[args.app]}")
    return args


def make_requests(args: argparse.Namespace, n: int = 1000) -> list[bytes]:
    """`n` request bodies, drawn from the checkpoint's own vocabulary (or --input), seeded."""
    rng = random.Random(args.seed)
    if args.app == "streamrec":
        from streamrec import Recommender

        items = Recommender.load(args.ckpt).vocab.items
        bodies = [{"history": rng.choices(items, k=rng.randint(5, 50)), "k": min(args.k, len(items))}
                  for _ in range(n)]
    else:
        if args.input:
            lines = [s for s in Path(args.input).read_text(encoding="utf-8").splitlines() if s.strip()]
        else:
            from translate import Translator

            vocab = Translator.load(args.ckpt).src_vocab
            lines = [vocab.decode([rng.randrange(4, len(vocab)) for _ in range(rng.randint(5, 15))]) for _ in range(n)]
        bodies = [{"text": rng.choice(lines), "beam_size": args.beam} for _ in range(n)]
    return [json.dumps(b).encode() for b in bodies]


def client(url: str, bodies: list[bytes], start: int, warm_at: float, stop_at: float,
           latencies: list[float], errors: list[str]) -> None:
    """Send requests back to back on one keep-alive connection; record latencies finished in [warm_at, stop_at)."""
    host = urlsplit(url)
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=60)
    i = start
    try:
        while (sent := time.perf_counter()) < stop_at:
            try:
                conn.request("POST", "/predict", bodies[i % len(bodies)], {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException) as err:
                conn.close()  # reconnects on the next request
                status = type(err).__name__
            done = time.perf_counter()
            if warm_at <= sent and done < stop_at:
                if status == 200:
                    latencies.append(done - sent)
                else:
                    errors.append(str(status))
            i += 1
    finally:
        conn.close()


class AsyncClient(asyncio.Protocol):
    """One closed-loop client on one keep-alive connection, driven by the event loop (no thread of its own).

    Requests are pre-encoded bytes; a response is complete when its Content-Length bytes have arrived.
    """

    def __init__(self, requests: list[bytes], start: int, warm_at: float, stop_at: float,
                 latencies: list[float], errors: list[str], done: asyncio.Future):
        self.requests, self.i, self.warm_at, self.stop_at = requests, start, warm_at, stop_at
        self.latencies, self.errors, self.done = latencies, errors, done
        self.buffer, self.end, self.status, self.sent = b"", -1, 0, 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.send_next()

    def send_next(self) -> None:
        self.sent = time.perf_counter()
        if self.sent >= self.stop_at:
            self.transport.close()
            return
        self.transport.write(self.requests[self.i % len(self.requests)])
        self.i += 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.end < 0:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end].lower()
            self.status = int(head[9:12])  # "HTTP/1.1 200 OK"
            at = head.find(b"\ncontent-length:")
            length = int(head[at + 16 : head.find(b"\r", at + 1)]) if at >= 0 else 0
            self.end = head_end + 4 + length
        if len(self.buffer) < self.end:
            return
        done = time.perf_counter()
        if self.warm_at <= self.sent and done < self.stop_at:
            if self.status == 200:
                self.latencies.append(done - self.sent)
            else:
                self.errors.append(str(self.status))
        self.buffer, self.end = self.buffer[self.end :], -1
        self.send_next()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)
        if exc is not None or time.perf_counter() < self.stop_at:
            self.errors.append(type(exc).__name__ if exc else "connection closed")


async def drive(url: str, bodies: list[bytes], clients: int, warm_at: float, stop_at: float,
                latencies: list[float], errors: list[str]) -> None:
    """`clients` AsyncClients until `stop_at`."""
    host = urlsplit(url)
    requests = [b"POST /predict HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (host.hostname.encode(), host.port, len(b), b) for b in bodies]
    loop = asyncio.get_running_loop()
    dones = []
    for c in range(clients):
        done = loop.create_future()
        await loop.create_connection(lambda c=c, done=done: AsyncClient(requests, c * 37, warm_at, stop_at, latencies,
                                                                        errors, done), host.hostname, host.port)
        dones.append(done)
    await asyncio.wait_for(asyncio.gather(*dones), stop_at - time.perf_counter() + 120)


def load(url: str, bodies: list[bytes], clients: int, warmup: float, seconds: float,
         kind: str = "async", warming: bool = False) -> dict[str, float]:
    """Closed-loop load from `clients` clients; req/s over the measured window and latency percentiles (ms).

    Exits when no request succeeded in the window, unless `warming` (a warm-up that ends before a fresh
    server's first answer has done its job; it returns {} then).
    """
    latencies: list[float] = []
    errors: list[str] = []
    warm_at = time.perf_counter() + warmup
    stop_at = warm_at + seconds
    if kind == "async":
        asyncio.run(drive(url, bodies, clients, warm_at, stop_at, latencies, errors))
    else:
        threads = [threading.Thread(target=client, args=(url, bodies, c * 37, warm_at, stop_at, latencies, errors))
                   for c in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=warmup + seconds + 120)
    if not latencies:
        if warming:
            return {}
        raise SystemExit(f"error: no request succeeded ({len(errors)} failed: {sorted(set(errors))[:3]})")
    ms = sorted(x * 1e3 for x in latencies)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"rps": len(ms) / seconds, "p50_ms": q[49], "p95_ms": q[94], "p99_ms": q[98],
            "requests": len(ms), "errors": len(errors)}


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (Linux /proc; [] elsewhere)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [pid, *(p for c in children for p in process_tree(int(c)))]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of `pids` so far (processes that ended are skipped)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def measured(url: str, bodies: list[bytes], args: argparse.Namespace, kind: str) -> dict[str, float]:
    """`load` after a warm-up, with the server's and the clients' CPU ms per answered request over the window."""
    if args.warmup > 0:
        load(url, bodies, args.clients, 0.0, args.warmup, kind, warming=True)
    pids = process_tree(os.getpid())[1:]  # the server is this process's only child
    server0, client0 = cpu_seconds(pids), resource.getrusage(resource.RUSAGE_SELF)
    result = load(url, bodies, args.clients, 0.0, args.seconds, kind)
    server1, client1 = cpu_seconds(pids), resource.getrusage(resource.RUSAGE_SELF)
    client_s = (client1.ru_utime + client1.ru_stime) - (client0.ru_utime + client0.ru_stime)
    result["server_cpu_ms"] = 1e3 * (server1 - server0) / result["requests"]
    result["client_cpu_ms"] = 1e3 * client_s / result["requests"]
    return result


def report(console: Console, args: argparse.Namespace, figures: dict[str, float], prefixes: dict[str, str]) -> None:
    """Print each client's table of the measured settings; with both settings, add the ratios to `figures`."""
    settings = [name for name in SETTINGS if name in args.setting]
    labels = {"batch1": "batch size 1",
              "dynamic": f"dynamic, <= {args.max_batch_size}, {args.batch_timeout * 1e3:g} ms"}
    for kind, pre in prefixes.items():
        rows = [[labels[name], f"{figures[f'{pre}{name}_rps']:.1f}", *(f"{figures[f'{pre}{name}_{p}_ms']:.0f}"
                 for p in ("p50", "p95", "p99")), str(figures[f"{pre}{name}_errors"]),
                 f"{figures[f'{pre}{name}_server_cpu_ms']:.2f}", f"{figures[f'{pre}{name}_client_cpu_ms']:.2f}"]
                for name in settings]
        print_table(console, f"{args.app}.serve, {args.clients} clients ({kind}), {args.seconds:g} s each",
                    ["setting", "req/s", "p50 ms", "p95 ms", "p99 ms", "errors", "server CPU ms/req",
                     "client CPU ms/req"], rows)
        if len(settings) < len(SETTINGS):
            continue
        figures[f"{pre}throughput_ratio"] = figures[f"{pre}dynamic_rps"] / figures[f"{pre}batch1_rps"]
        figures[f"{pre}server_cpu_ratio"] = (figures[f"{pre}batch1_server_cpu_ms"]
                                             / figures[f"{pre}dynamic_server_cpu_ms"])
        who = f" ({kind} clients)" if pre else ""
        console.print(f"dynamic batching{who}: {figures[f'{pre}throughput_ratio']:.2f}x the throughput of batch "
                      f"size 1; {figures[f'{pre}server_cpu_ratio']:.2f}x less server CPU per request")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from core.runtime.serve import local_server  # after the arguments: LitServe and FastAPI take a while to import

    console = Console()
    bodies = make_requests(args)
    settings = {"batch1": ["--max-batch-size", "1"],
                "dynamic": ["--max-batch-size", str(args.max_batch_size), "--batch-timeout", str(args.batch_timeout)]}
    figures: dict[str, float] = {"clients": args.clients, "seconds": args.seconds,
                                 "async_client": int("async" in args.client),  # 1: measured with that client
                                 "threads_client": int("threads" in args.client),
                                 "max_batch_size": args.max_batch_size, "batch_timeout": args.batch_timeout}
    # One client: figures as SETTING_FIGURE; several: CLIENT_SETTING_FIGURE.
    prefixes = {kind: f"{kind}_" if len(args.client) > 1 else "" for kind in args.client}
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(args.log_dir or tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        for name, extra in settings.items():
            if name not in args.setting:
                continue
            server_args = ["--ckpt", args.ckpt, *extra, "--log-level", "warning", "--threads", str(args.threads)]
            console.print(f"{name}: starting python -m {args.app}.serve {' '.join(extra)}")
            with local_server(f"{args.app}.serve", server_args, log_dir / f"{args.app}_{name}.log", ready_s=300) as url:
                for kind, pre in prefixes.items():
                    result = measured(url, bodies, args, kind)
                    figures.update({f"{pre}{name}_{key}": value for key, value in result.items()})
    report(console, args, figures, prefixes)
    if args.json:
        write_json(args.json, figures)


if __name__ == "__main__":
    main()
