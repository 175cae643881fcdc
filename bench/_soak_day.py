r"""``bench.soak --mode=day``: the operator's day, on ``python -m serving.server`` (``bench/soak.py``'s server, model,
clients and request kinds):

    python -m bench.soak --mode=day --swaps=20 --phase_seconds=120 --slow_clients=500 --concurrency=16

Three phases, one after another, with ``--concurrency`` real clients (REST and gRPC predictions) all day:

1. ``swaps``: ``--swaps`` hot swaps of the same model, each a new version folder dropped in whole (atomic
   rename); the next swap waits until the server reports the new version AVAILABLE (its own status);
   the old folder is then removed, so the server unloads it. At least ``--phase_seconds`` long.
2. ``slow``: ``--slow_clients`` connections send a partial request head and hold it (one the server
   closes is opened again), beside the real clients, for ``--phase_seconds``.
3. ``malformed``: the real clients send ``bench.soak.KINDS`` in turn (bad JSON, 1,000-deep JSON,
   1 MB bodies, invalid UTF-8, lone surrogates, ... and good requests) for ``--phase_seconds``.

Every ``--sample_seconds`` a row: the phase, the server's RSS / threads / open files, requests in the
window, good requests that failed, p99 of the good ones, the version answering. The table goes to
stdout and ``--output`` (``.md``, with ``.json`` beside it; default ``bench/results/soak_day.md``). Every request
goes to 127.0.0.1.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

from absl import flags

from bench.soak import (EXPECTED, GOOD, HOST, KINDS, ROOT, _PREDICT, Client, percentile_ms, send_one, server_stats,
                        soak)

OUTPUT = "bench/results/soak_day.md"


def define_flags():
    """The day's own flags (``--concurrency``, ``--tokenizer_dir``, ``--output``, ``--server_flag``: ``bench.soak``'s)."""
    flags.DEFINE_integer("swaps", 20, "--mode=day: hot swaps in the first phase")
    flags.DEFINE_float("phase_seconds", 120, "--mode=day: length of each phase (the swap phase lasts at least this)")
    flags.DEFINE_integer("slow_clients", 500, "--mode=day: connections holding a partial header in the second phase")
    flags.DEFINE_float("sample_seconds", 10, "--mode=day: one table row per this many seconds")


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


def day(args) -> dict:
    """``bench.soak.soak``'s export and server, with the day's phases as its run."""
    return soak(args, _day_run, prefix="soak_day_", root=ROOT)


def _day_run(args, proc, work: Path, grpc_port: int, rest_port: int) -> dict:
    shutil.copytree(work / "models" / "sst2" / "1", work / "source")  # what each swap drops in again
    return run(args, proc, work, grpc_port, rest_port)


def real_client(client: Client, kinds: list, offset: int, stop: threading.Event, results: list, lock) -> None:
    """One real client all day: ``kinds[0]`` (the phase's request kinds) in turn until ``stop``."""
    i = offset
    while not stop.is_set():
        send_one(client, kinds[0][i % len(kinds[0])], results, lock)
        i += 1


def run(args, proc, work: Path, grpc_port: int, rest_port: int) -> dict:
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
    output = Path(args.output or OUTPUT)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    output.with_suffix(".json").write_text(json.dumps({"rows": table, "summary": summary}, indent=1) + "\n")
    return {"rows": table, "summary": summary}

