r"""Soak test of ``python -m serving.server``: mixed good and malformed traffic, a version swap midway; or the
operator's day (``--mode=day``).

    python -m bench.soak --minutes=5 --concurrency=16 [--output=bench/results/soak.json]
    python -m bench.soak --mode=day --swaps=20 --phase_seconds=120 --slow_clients=500   # the operator's day

Exports a ``test``-preset SST-2 task model (random weights, GPT-1's BPE from ``../shared/data``) as version 1 and
starts the server on free ports of 127.0.0.1 (``bench/_servers.py``: the model, the server, the clients and the
request kinds). Every request goes to 127.0.0.1.

**Mixed** (default): ``--concurrency`` client threads for ``--minutes`` (each loop also stops after
``--max_requests`` requests), each cycling through the request kinds of ``KINDS``: REST and gRPC predictions
(good) and malformed ones. Halfway, version 2 is copied in beside version 1 (atomic rename) and the server swaps to
it under load. Reported (stdout and ``--output`` JSON): requests, outcomes by kind and status, good requests that
failed, p50 / p99 latency of the good requests, the server's RSS, threads and open files at start (models loaded),
after warm-up (``--warmup_fraction`` of the time) and at the end, and the size of the server's log. Then ``--hold``
connections send a partial header and hold it: how many the server refuses at once, its threads and open files
meanwhile.

**The operator's day** (``--mode=day``): three phases, one after another, with ``--concurrency`` real clients (REST
and gRPC predictions) all day:

1. ``swaps``: ``--swaps`` hot swaps of the same model, each a new version folder dropped in whole (atomic
   rename); the next swap waits until the server reports the new version AVAILABLE (its own status);
   the old folder is then removed, so the server unloads it. At least ``--phase_seconds`` long.
2. ``slow``: ``--slow_clients`` connections send a partial request head and hold it (one the server
   closes is opened again), beside the real clients, for ``--phase_seconds``.
3. ``malformed``: the real clients send ``KINDS`` in turn (bad JSON, 1,000-deep JSON, 1 MB bodies, invalid UTF-8,
   lone surrogates, ... and good requests) for ``--phase_seconds``.

Every ``--sample_seconds`` a row: the phase, the server's RSS / threads / open files, requests in the window, good
requests that failed, p99 of the good ones, the version answering. The table goes to stdout and ``--output``
(``.md``, with ``.json`` beside it; default ``bench/results/soak_day.md``).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

from absl import app, flags

from bench._servers import (_PREDICT, EXPECTED, GOOD, HOST, KINDS, Client, drive, export_sst2, free_port,
                            percentile_ms, send_one, server_port, server_stats, spawn_server, stop_server)
from bench.harness import ROOT

FLAGS = flags.FLAGS
DAY_OUTPUT = "bench/results/soak_day.md"


# ----------------------------------------------------------------------------- mixed traffic


def hold_partial_headers(port: int, pid: int, count: int) -> dict:
    """Opens ``count`` connections that each send a partial header and hold it (bounded: 2 s per connect).

    Reports how many the server refused at once (503 or closed within 1 s), its threads and open
    files while they are held, and how many connects waited (a full listen backlog drops SYNs)."""
    held, refused, connects = [], 0, []
    try:
        for _ in range(count):
            start = time.perf_counter()
            s = socket.create_connection((HOST, port), timeout=2)
            connects.append(time.perf_counter() - start)
            s.sendall(f"POST {_PREDICT} HTTP/1.1\r\nHo".encode())
            held.append(s)
        time.sleep(1.0)
        during = server_stats(pid)
        for s in held:
            s.setblocking(False)
            try:
                answer = s.recv(64)
                refused += answer == b"" or answer.startswith(b"HTTP/1.1 503")
            except BlockingIOError:
                pass
            except OSError:
                refused += 1
    finally:
        for s in held:
            s.close()
    return {"connections": count, "refused_within_1s": refused, "connects_over_500ms": sum(c > 0.5 for c in connects),
            "slowest_connect_ms": round(1000 * max(connects, default=0), 1), "server_while_held": during}


def summarize(results, snapshots, log_path: Path, versions, shed_note) -> dict:
    by_kind = collections.defaultdict(collections.Counter)
    for kind, outcome, _, _ in results:
        by_kind[kind][outcome] += 1
    good = [r for r in results if r[0] in GOOD]
    unexpected = {k: {o: n for o, n in c.items() if o != EXPECTED[k]} for k, c in by_kind.items()}
    log_text = log_path.read_text(errors="replace")
    return {
        "requests": len(results), "good": len(good), "malformed": len(results) - len(good),
        "good_failed": sum(1 for r in good if r[1] != EXPECTED[r[0]]),
        "by_kind": {k: dict(c) for k, c in sorted(by_kind.items())},
        "unexpected": {k: v for k, v in unexpected.items() if v},
        "latency_ms_good": {"p50": percentile_ms([r[2] for r in good], 50),
                            "p99": percentile_ms([r[2] for r in good], 99)},
        "grpc_versions": dict(versions), "server": snapshots,
        "server_log": {"bytes": len(log_text.encode()), "lines": len(log_text.splitlines()),
                       "tracebacks": log_text.count("Traceback")}, "note": shed_note,
    }


def mixed(args, proc, work: Path, grpc_port: int, rest_port: int) -> dict:
    """The mixed soak's run on a started server; its report."""
    snapshots = {"start": server_stats(proc.pid)}
    seconds = 60 * args.minutes
    t0 = time.monotonic()
    deadline = t0 + seconds
    results, lock = [], threading.Lock()
    clients = [Client(rest_port, grpc_port) for _ in range(args.concurrency)]
    kinds = [k for k in KINDS if k in args.kinds.split(",")] or args.kinds.split(",")
    threads = [threading.Thread(target=drive, args=(c, kinds, 7 * i, deadline, args.max_requests, results, lock),
                                daemon=True) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    time.sleep(seconds * args.warmup_fraction)
    snapshots["after_warmup"] = {**server_stats(proc.pid), "requests": len(results)}
    time.sleep(max(0.0, t0 + seconds / 2 - time.monotonic()))
    snapshots["before_swap"] = {**server_stats(proc.pid), "requests": len(results)}
    if not args.no_swap:
        staging = work / "models" / ".staging-2"
        shutil.copytree(work / "models" / "sst2" / "1", staging)
        os.rename(staging, work / "models" / "sst2" / "2")
        snapshots["swap_at_s"] = round(time.monotonic() - t0, 1)
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.monotonic() + 60))
    snapshots["end"] = {**server_stats(proc.pid), "requests": len(results)}
    if args.hold:
        snapshots["partial_headers_held"] = hold_partial_headers(rest_port, proc.pid, args.hold)
    versions = sum((c.versions for c in clients), collections.Counter())
    report = summarize(results, snapshots, work / "server.log", versions,
                       f"{args.concurrency} clients, {args.minutes} min, warm-up {args.warmup_fraction:.0%}")
    grow = report["server"]["end"]["rss_mb"] / report["server"]["after_warmup"]["rss_mb"] - 1
    report["rss_growth_after_warmup"] = f"{100 * grow:+.1f}%"
    text = json.dumps(report, indent=1)
    print(text, flush=True)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n")
    return report


# ----------------------------------------------------------------------------- the operator's day


class SlowClients:
    """``count`` connections holding a partial head; reopened when the server closes them (counted)."""

    def __init__(self, port: int, count: int):
        self.port, self.count, self.socks, self.closed, self.refused = port, count, [], 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _open(self):
        s = socket.create_connection((HOST, self.port), timeout=2)
        s.sendall(f"POST {_PREDICT} HTTP/1.1\r\nHo".encode())
        s.setblocking(False)
        return s

    def _loop(self):
        while not self._stop.is_set():
            kept = []
            for s in self.socks:
                try:
                    answer = s.recv(64)
                except BlockingIOError:
                    kept.append(s)
                    continue
                except OSError:
                    answer = b""
                self.refused += answer.startswith(b"HTTP/1.1 503")
                self.closed += not answer.startswith(b"HTTP/1.1 503")
                s.close()
            self.socks = kept
            while len(self.socks) < self.count and not self._stop.is_set():
                try:
                    self.socks.append(self._open())
                except OSError:
                    break
            self._stop.wait(0.5)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join()
        for s in self.socks:
            s.close()
        self.socks = []


def swap(models: Path, source: Path, version: int, rest_port: int, deadline: float) -> None:
    """Drops ``version`` in (atomic rename), waits for the server to serve it, removes the one before."""
    import http.client

    staging = models / f".staging-{version}"
    shutil.copytree(source, staging)
    os.rename(staging, models / "sst2" / str(version))
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection(HOST, rest_port, timeout=30)
        try:
            conn.request("GET", f"/v1/models/sst2/versions/{version}")
            body = json.loads(conn.getresponse().read() or b"{}")
        except (OSError, http.client.HTTPException, ValueError):
            body = {}
        finally:
            conn.close()
        if (body.get("model_version_status") or [{}])[0].get("state") == "AVAILABLE":
            break
        time.sleep(0.5)
    shutil.rmtree(models / "sst2" / str(version - 1), ignore_errors=True)


def rows(results, samples) -> list[dict]:
    """One row per sample: the window's requests, failed good ones, p99 of the good ones."""
    table, start = [], samples[0]["t"]
    for before, after in zip(samples, samples[1:]):
        window = [r for r in results if before["t"] <= r[3] < after["t"]]
        good = [r for r in window if r[0] in GOOD]
        table.append({"t_s": round(after["t"] - start), "phase": after["phase"], "rss_mb": after["rss_mb"],
                      "threads": after["threads"], "fds": after["fds"], "requests": len(window),
                      "good": len(good), "good_failed": sum(r[1] != EXPECTED[r[0]] for r in good),
                      "malformed": len(window) - len(good), "p99_ms": percentile_ms([r[2] for r in good], 99),
                      "slow_held": after.get("slow_held", 0)})
    return table


def markdown(table: list[dict], summary: dict) -> str:
    cols = list(table[0]) if table else []
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("" if row[c] is None else str(row[c]) for c in cols) + " |" for row in table]
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {k}: {json.dumps(v)}" for k, v in summary.items()) + "\n"


def real_client(client: Client, kinds: list, offset: int, stop: threading.Event, results: list, lock) -> None:
    """One real client all day: ``kinds[0]`` (the phase's request kinds) in turn until ``stop``."""
    i = offset
    while not stop.is_set():
        send_one(client, kinds[0][i % len(kinds[0])], results, lock)
        i += 1


def day(args, proc, work: Path, grpc_port: int, rest_port: int) -> dict:
    """The operator's day on a started server; its table and summary."""
    shutil.copytree(work / "models" / "sst2" / "1", work / "source")  # what each swap drops in again
    results, lock, phase, samples = [], threading.Lock(), ["swaps"], []
    slow = SlowClients(rest_port, args.slow_clients)
    stop = threading.Event()

    def sample():
        samples.append({"t": time.monotonic(), "phase": phase[0], **server_stats(proc.pid),
                        "slow_held": len(slow.socks)})

    def sampler():
        while not stop.wait(args.sample_seconds):
            sample()

    sample()
    threading.Thread(target=sampler, daemon=True).start()
    kinds = [list(GOOD)]
    threads = [threading.Thread(target=real_client, args=(Client(rest_port, grpc_port), kinds, 7 * i, stop, results,
                                                          lock), daemon=True) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    t0, done_swaps = time.monotonic(), 0
    for version in range(2, args.swaps + 2):
        swap(work / "models", work / "source", version, rest_port, time.monotonic() + 600)
        done_swaps += 1
    time.sleep(max(0.0, t0 + args.phase_seconds - time.monotonic()))
    phase[0] = "slow"
    slow.start()
    time.sleep(args.phase_seconds)
    slow.stop()
    phase[0], kinds[0] = "malformed", list(KINDS)
    time.sleep(args.phase_seconds)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    sample()
    table = rows(results, samples)
    good = [r for r in results if r[0] in GOOD]
    summary = {"swaps": done_swaps, "requests": len(results), "good": len(good),
               "good_failed": sum(r[1] != EXPECTED[r[0]] for r in good),
               "outcomes_not_expected": dict(collections.Counter(f"{r[0]} -> {r[1]}" for r in results
                                                                  if r[1] != EXPECTED[r[0]])),
               "slow_clients_closed_by_server": slow.closed, "slow_clients_refused_503": slow.refused,
               "rss_mb_first_row": table[0]["rss_mb"] if table else None,
               "rss_mb_end": samples[-1]["rss_mb"], "server_log_tracebacks":
                   (work / "server.log").read_text(errors="replace").count("Traceback")}
    text = markdown(table, summary)
    print(text, flush=True)
    output = Path(args.output or DAY_OUTPUT)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    output.with_suffix(".json").write_text(json.dumps({"rows": table, "summary": summary}, indent=1) + "\n")
    return {"rows": table, "summary": summary}


def define_flags():
    flags.DEFINE_enum("mode", "mixed", ["mixed", "day"], "mixed: the soak above; day: the operator's day")
    flags.DEFINE_float("minutes", 5.0, "how long the clients send requests")
    flags.DEFINE_integer("concurrency", 16, "client threads")
    flags.DEFINE_integer("max_requests", 1_000_000, "per client thread")
    flags.DEFINE_float("warmup_fraction", 0.2, "share of --minutes before the after-warm-up memory snapshot")
    flags.DEFINE_string("kinds", ",".join(dict.fromkeys(KINDS)), "request kinds to send (default: all)")
    flags.DEFINE_bool("no_swap", False, "no version swap (memory under one version only)")
    flags.DEFINE_integer("hold", 500, "then hold this many partial headers (0: skip)")
    flags.DEFINE_string("tokenizer_dir", str(ROOT.parent / "shared" / "data" / "gpt1_bpe"), "GPT-1's BPE")
    flags.DEFINE_string("output", "", "also write the report here (--mode=day: bench/results/soak_day.md)")
    flags.DEFINE_multi_string("server_flag", [], "extra serving.server flag (repeatable)")
    flags.DEFINE_string("server_root", str(ROOT), "checkout whose serving.server runs (to compare)")
    flags.DEFINE_integer("swaps", 20, "--mode=day: hot swaps in the first phase")
    flags.DEFINE_float("phase_seconds", 120, "--mode=day: length of each phase (the swap phase lasts at least this)")
    flags.DEFINE_integer("slow_clients", 500, "--mode=day: connections holding a partial header in the second phase")
    flags.DEFINE_float("sample_seconds", 10, "--mode=day: one table row per this many seconds")


def main(argv) -> None:
    del argv  # everything is a flag
    soak(FLAGS)


def soak(args) -> dict:
    """Exports a model, starts the server, runs the soak (or the day); the report as a dict."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    work = Path(tempfile.mkdtemp(prefix=f"soak_{args.mode}_"))
    try:
        export_sst2(work / "models", "test", args.tokenizer_dir, 40478)
        grpc_port, rest_port = free_port(), free_port()
        proc = spawn_server(work / "models", "sst2", f"--port={grpc_port}", f"--rest_api_port={rest_port}",
                            "--file_system_poll_wait_seconds=0.5", *args.server_flag,
                            root=Path(args.server_root), log=work / "server.log")
        try:
            server_port(proc)  # the model is loaded
            return (day if args.mode == "day" else mixed)(args, proc, work, grpc_port, rest_port)
        finally:
            stop_server(proc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
