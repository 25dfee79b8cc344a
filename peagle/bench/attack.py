"""``peagle bench attack`` (or ``python -m peagle.bench.attack``): ``peagle serve`` under a hostile
client (issue 38). A streamed completion, the victim, runs alone (``--victims`` times, one after
another), then one after another for as long as attackers send a 64 MiB body (by its Content-Length,
and chunked), a 2M-character prompt and 10^4 stop strings of 200 characters (``--repeats`` times each)
and hold slow-loris connections that trickle their headers a byte a second until the server cuts them.
Reported: the victims' gaps between two tokens in each run (the goal: no attack delays a stream's next
token by more than 100 ms), the largest ones with when they ended and when each attack was sent (to
tell them from the other jobs of a shared machine), what each attack got back and how soon, and the
server processes' peak RSS growth over the run (the goal: at most twice the body limit). Every victim
must write the same text."""
from __future__ import annotations

import argparse
import http.client
import json
import select
import shlex
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

from peagle.bench.machine import OtherLoad, cpu_name, wait_for_idle
from peagle.bench.serving import running
from peagle.serve.limits import ServerLimits

MiB = 2 ** 20
ATTACKS = ("body", "chunked", "prompt", "stops", "loris")
VICTIM = {"prompt": "Write a long story about a lighthouse keeper and the sea.", "temperature": 0,
          "ignore_eos": True, "stream": True}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=8766)
    p.add_argument("--max-tokens", type=int, default=400, help="the victim's length")
    p.add_argument("--victims", type=int, default=3, help="victims one after another alone (attacked: as many "
                                                          "as the attacks last)")
    p.add_argument("--attacks", type=_attacks, default=ATTACKS, help=f"comma-separated, of {','.join(ATTACKS)} "
                                                                       "(default: all)")
    p.add_argument("--loris", type=int, default=16, help="slow-loris connections")
    p.add_argument("--repeats", type=int, default=3, help="times each body attack is sent (0.5 s apart)")
    p.add_argument("--wait-idle", type=float, default=300,
                   help="before each run, wait at most this many s for other processes to quieten (a shared machine)")
    p.add_argument("--server-args", default="", help="more `peagle serve` flags, as one string ('--target T ...')")
    p.add_argument("--json", default=None, help="also write every measurement to this JSON file")


def _attacks(text: str) -> list[str]:
    names = text.split(",")
    if unknown := sorted(set(names) - set(ATTACKS)):
        raise argparse.ArgumentTypeError(f"unknown attacks {unknown}; choose from {','.join(ATTACKS)}")
    return names


def main(args: argparse.Namespace) -> int:
    cmd = [sys.executable, "-m", "peagle.cli", "serve", "--port", str(args.port), *shlex.split(args.server_args)]
    body = {**VICTIM, "max_tokens": args.max_tokens}
    runs: dict[str, dict] = {}
    texts: dict[str, set[str]] = {}
    with running(cmd, args.port) as (_, proc):
        for name in ("alone", "attacked"):
            wait_for_idle(args.wait_idle)
            with Server(proc.pid) as server:
                t0 = time.perf_counter()
                if name == "alone":
                    streams, attacks = [victim(args.port, body) for _ in range(args.victims)], []
                else:
                    streams, attacks = under_attack(args, body, t0)
            runs[name] = {"victims": len(streams), **gaps(streams, t0, at_work(attacks)), **server.figures()}
            texts[name] = {v["text"] for v in streams}
    out = {"command": shlex.join(cmd), "cpu": cpu_name(), "body_limit_bytes": ServerLimits().max_body_bytes, **runs,
           "same_text": len(texts["alone"] | texts["attacked"]) == 1, "attacks": attacks}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(report(out))
    return 0


class Server:
    """The server's processes (it and its children: the engine) during a ``with`` block: their RSS
    peak over its value at the start (sampled every 10 ms), their CPU, and the cores the rest of the
    machine kept busy beside them and this process (the other sessions of a shared machine)."""

    def __init__(self, pid: int):
        self.proc = psutil.Process(pid)

    def _tree(self) -> tuple[int, float]:
        """(RSS bytes, CPU seconds) of the server's processes."""
        rss, cpu = 0, 0.0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                rss, cpu = rss + p.memory_info().rss, cpu + sum(p.cpu_times()[:2])
            except psutil.NoSuchProcess:
                pass
        return rss, cpu

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self._tree()[0])

    def __enter__(self):
        self.load = OtherLoad().__enter__()
        (self.start, self.cpu), self.wall = self._tree(), time.perf_counter()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.load.__exit__(*exc)
        self.wall, self.cpu = time.perf_counter() - self.wall, self._tree()[1] - self.cpu
        return False

    def figures(self) -> dict:
        others = None if self.load.cores is None else max(0.0, self.load.cores - self.cpu / self.wall)
        return {"rss_growth_mib": (self.peak - self.start) / MiB, "server_cores": self.cpu / self.wall,
                "other_load_cores": others}


def victim(port: int, body: dict, started: threading.Event | None = None) -> dict:
    """The streamed completion: its text and the arrival time of each event."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    times, text = [], []
    while line := r.readline():
        if line.startswith(b"data: {"):
            times.append(time.perf_counter())
            text.append(json.loads(line[6:])["choices"][0]["text"])
            if started is not None and len(times) == 20:
                started.set()
        elif line.startswith(b"data: [DONE]"):
            break
    conn.close()
    if started is not None:  # a stream of fewer than 20 events (a speculating server sends several tokens an event)
        started.set()        # still lets the attacks begin, rather than leaving them waiting forever
    return {"times": times, "text": "".join(text)}


def gaps(streams: list[dict], t0: float, windows: list[tuple[float, float]]) -> dict:
    """The gaps between a stream's events, over all ``streams``: median, p99, largest, the largest of
    those that overlap one of ``windows`` (s after ``t0``: the server at work on an attack; the others
    are the shared machine's), and the five largest with when they ended."""
    g = sorted((b - a, a - t0, b - t0) for v in streams for a, b in zip(v["times"], v["times"][1:]))
    ms = [1e3 * x for x, _, _ in g]
    near = [1e3 * x for x, start, end in g if any(start < w1 and end > w0 for w0, w1 in windows)]
    return {"events": sum(len(v["times"]) for v in streams), "gap_ms_median": statistics.median(ms),
            "gap_ms_p99": ms[int(0.99 * (len(ms) - 1))], "gap_ms_max": ms[-1],
            "gap_ms_max_at_attacks": max(near, default=None),
            "largest_gaps": [{"ms": 1e3 * x, "ended_at_s": end} for x, _, end in g[-5:]]}


def at_work(attacks: list[dict]) -> list[tuple[float, float]]:
    """When the server was at work on an attack (s after the run's start): a request from its sending
    to 0.1 s after its answer; a slow-loris connection as it connects and as it is cut."""
    out = []
    for a in attacks:
        start, end = a["sent_at_s"], a["sent_at_s"] + a["seconds"]
        out += [(start, start + 0.1), (end - 0.1, end + 0.1)] if a.get("holds_connection") else [(start, end + 0.1)]
    return out


def under_attack(args: argparse.Namespace, body: dict, t0: float) -> tuple[list[dict], list[dict]]:
    """Victims one after another until every attack has its answer; the attacks start once the first
    victim has its 20th token. Each attack's record says when it was sent (s after ``t0``)."""
    started, done, streams, attacks = threading.Event(), threading.Event(), [], []

    def victims():
        while not done.is_set() or not streams:
            streams.append(victim(args.port, body, started))

    stream = threading.Thread(target=victims)
    stream.start()
    started.wait()

    def repeat(name, fn, *a):
        for _ in range(args.repeats):
            attacks.append({"attack": name, "sent_at_s": time.perf_counter() - t0, **fn(*a)})
            time.sleep(0.5)

    prompt = json.dumps({"prompt": "x" * 2_000_000}).encode()
    stops = json.dumps({"prompt": "Hi", "stop": ["s" * 200] * 10_000}).encode()
    every = {"body": ("64 MiB body, Content-Length", huge_body, args.port, 64 * MiB, False),
             "chunked": ("64 MiB body, chunked", huge_body, args.port, 64 * MiB, True),
             "prompt": ("2M-character prompt", post, args.port, prompt),
             "stops": ("10^4 stop strings of 200 characters", post, args.port, stops)}
    threads = [threading.Thread(target=repeat, args=every[a]) for a in args.attacks if a in every]
    if "loris" in args.attacks:
        threads.append(threading.Thread(target=lambda: attacks.extend(slow_loris(args.port, args.loris, t0))))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    stream.join()
    return streams, attacks


def answer(sock: socket.socket, t0: float) -> dict:
    """Status, error type and seconds to the server's answer (read to its close); a reset reads as status None."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    sock.close()
    seconds = time.perf_counter() - t0
    if not data:
        return {"status": None, "error": "connection reset", "seconds": seconds}
    head, _, rest = data.partition(b"\r\n\r\n")
    try:
        kind = json.loads(rest)["error"]["type"]
    except (ValueError, KeyError, TypeError):
        kind = rest[:80].decode(errors="replace")
    return {"status": int(head.split()[1]), "error": kind, "seconds": seconds}


def huge_body(port: int, size: int, chunked: bool) -> dict:
    """Send ``size`` bytes of body as fast as the server takes them, until it answers."""
    sock = socket.create_connection(("127.0.0.1", port))
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
                 .encode())
    t0, piece, sent = time.perf_counter(), b" " * 65536, 0
    frame = b"10000\r\n" + piece + b"\r\n" if chunked else piece
    try:
        while sent < size and not select.select([sock], [], [], 0)[0]:
            sock.sendall(frame)
            sent += len(piece)
    except OSError:   # the server has closed the connection
        pass
    return {**answer(sock, t0), "body_bytes_sent": sent}


def post(port: int, body: bytes) -> dict:
    sock = socket.create_connection(("127.0.0.1", port))
    t0 = time.perf_counter()
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    return {**answer(sock, t0), "body_bytes_sent": len(body)}


def slow_loris(port: int, n: int, t_start: float) -> list[dict]:
    """``n`` connections that send a request's headers a byte a second, each until the server cuts it."""
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 10_000
    socks = {socket.create_connection(("127.0.0.1", port)): 0 for _ in range(n)}
    t0, out = time.perf_counter(), []
    while socks and time.perf_counter() - t0 < 120:
        for s in select.select(list(socks), [], [], 1.0)[0]:
            socks.pop(s)
            out.append({"attack": "slow-loris headers, a byte a second", "sent_at_s": t0 - t_start,
                        "holds_connection": True, **answer(s, t0)})
        for s, i in socks.items():
            try:
                s.send(head[i:i + 1])
                socks[s] = i + 1
            except OSError:
                pass
    for s in socks:   # never cut
        out.append({"attack": "slow-loris headers, a byte a second", "sent_at_s": t0 - t_start,
                    "holds_connection": True, "status": None, "error": "still open",
                    "seconds": time.perf_counter() - t0})
        s.close()
    return out


def report(out: dict) -> str:
    lines = [f"{out['cpu']}; server: {out['command']}", "",
             "| victim streams | streams | events | median gap ms | p99 gap ms | max gap ms | "
             "max gap ms at an attack | server RSS growth MiB | server's cores | other sessions' cores |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in ("alone", "attacked"):
        r = out[name]
        load = "?" if r["other_load_cores"] is None else f"{r['other_load_cores']:.2f}"
        near = "-" if r["gap_ms_max_at_attacks"] is None else f"{r['gap_ms_max_at_attacks']:.1f}"
        lines.append(f"| {name} | {r['victims']} | {r['events']} | {r['gap_ms_median']:.1f} | {r['gap_ms_p99']:.1f} | "
                     f"{r['gap_ms_max']:.1f} | {near} | {r['rss_growth_mib']:.1f} | {r['server_cores']:.2f} | {load} |")
    lines += ["", f"same text alone and attacked: {out['same_text']}; body limit "
                  f"{out['body_limit_bytes'] / MiB:g} MiB", "",
              "| attack | answers (status, error) | seconds to answer (max) | body bytes sent (max) |",
              "|---|---|---:|---:|"]
    for name in dict.fromkeys(a["attack"] for a in out["attacks"]):
        runs = [a for a in out["attacks"] if a["attack"] == name]
        kinds = ", ".join(f"{n} x {s} {e}" for (s, e), n in Counter((a["status"], a["error"]) for a in runs).items())
        sent = max((a.get("body_bytes_sent", 0) for a in runs), default=0)
        lines.append(f"| {name} | {kinds} | {max(a['seconds'] for a in runs):.2f} | {sent} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m peagle.bench.attack", description=__doc__.split("\n\n")[0])
    add_args(parser)
    sys.exit(main(parser.parse_args()))
