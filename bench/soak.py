r"""Soak test of ``python -m serving.server``: mixed good and malformed traffic, a version swap midway.

    python -m bench.soak --minutes=5 --concurrency=16 [--output=bench/results/soak.json]
    python -m bench.soak --mode=day --swaps=20 --phase_seconds=120 --slow_clients=500   # the operator's day

Exports a ``test``-preset SST-2 task model (random weights, GPT-1's BPE from ``../shared/data``)
as version 1, starts the server on free ports of 127.0.0.1, and runs ``--concurrency`` client
threads for ``--minutes`` (each loop also stops after ``--max_requests`` requests). Each thread
cycles through the request kinds of ``KINDS``: REST and gRPC predictions (good), and malformed
ones: bad JSON (also 1 MB of it), JSON nested 1,000 deep, a ragged 1 MB array, wrong types, an unknown model, invalid UTF-8,
a lone surrogate, a version past 64 bits, a
Content-Length of 999,999,999 without a body, no Content-Length, a body cut off by the client, a
partial header then a hang-up, gRPC wrong dtype / invalid UTF-8. Halfway, version 2 is copied
in beside version 1 (atomic rename) and the server swaps to it under load.

Reported (stdout and ``--output`` JSON): requests, outcomes by kind and status, good requests that
failed, p50 / p99 latency of the good requests, the server's RSS, threads and open files at
start (models loaded), after warm-up (``--warmup_fraction`` of the time) and at the end, and the
size of the server's log. Then ``--hold`` connections send a partial header and hold it: how many
the server refuses at once, its threads and open files meanwhile. Every request goes to 127.0.0.1.
``--mode=day`` (``bench/_soak_day.py``) runs the operator's day on the same pieces: hot swaps, slow clients,
malformed traffic, a table over time in ``bench/results/soak_day.{md,json}``.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from absl import app, flags

from bench.harness import ROOT

FLAGS = flags.FLAGS
HOST = "127.0.0.1"
TEXT = "a gripping, funny and touching film"
_PREDICT = "/v1/models/sst2:predict"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def server_stats(pid: int) -> dict:
    """RSS (MB), threads and open file descriptors of a process (Linux /proc)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {"rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1), "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


# ------------------------------------------------------------------------------------------ requests
def _raw(port: int, data: bytes, read: bool = True, timeout: float = 30.0) -> str:
    """Sends raw bytes on a fresh connection; the response's status code, or 'closed' / 'no answer'."""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(data)
        if not read:
            return "hung up"
        try:
            head = s.recv(64)
        except (ConnectionError, socket.timeout):
            return "closed"
    return head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/") else "closed"


def _post(port: int, body: bytes, path: str = _PREDICT) -> str:
    head = f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return _raw(port, head.encode() + body)


class Client:
    """One client thread's connections; ``send(kind)`` -> outcome string."""

    def __init__(self, rest_port: int, grpc_port: int):
        import grpc
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        self.rest_port, self.grpc = rest_port, grpc
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"{HOST}:{grpc_port}"))
        self.conn = None
        self.versions = collections.Counter()

    def _grpc(self, value, dtype) -> str:
        import numpy as np
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2

        request = predict_pb2.PredictRequest()
        request.model_spec.name = "sst2"
        request.inputs["sentence"].CopyFrom(tf.make_tensor_proto(np.array(value, dtype)))
        try:
            response = self.stub.Predict(request, timeout=30)
        except self.grpc.RpcError as err:
            return f"grpc {err.code().name}"
        self.versions[response.model_spec.version.value] += 1
        return "grpc OK"

    def _rest_good(self) -> str:
        import http.client

        body = json.dumps({"instances": [{"sentence": TEXT}]})
        for _ in range(2):  # a keep-alive connection the server closed (idle timeout) is reopened once
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(HOST, self.rest_port, timeout=30)
                self.conn.request("POST", _PREDICT, body, {"Content-Type": "application/json"})
                response = self.conn.getresponse()
                response.read()
                return str(response.status)
            except (ConnectionError, http.client.HTTPException, socket.timeout):
                self.conn.close()
                self.conn = None
        return "closed"

    def send(self, kind: str) -> str:
        p = self.rest_port
        if kind == "rest_predict":
            return self._rest_good()
        if kind == "grpc_predict":
            return self._grpc([TEXT], object)
        if kind == "bad_json":
            return _post(p, b"{not json")
        if kind == "deep_json":
            return _post(p, b'{"instances": ' + b"[" * 1000 + b"]" * 1000 + b"}")
        if kind == "big_bad_json":  # 1 MB, an unterminated string
            return _post(p, b'{"instances": ["' + b"x" * 1_000_000)
        if kind == "big_ragged":  # 1 MB of rows, the last one longer
            return _post(p, b'{"instances": [' + b'["a"],' * 170_000 + b'["a", "b"]]}')
        if kind == "wrong_type":
            return _post(p, b'{"instances": [1, 2, 3]}')
        if kind == "unknown_model":
            return _post(p, b'{"instances": ["a"]}', "/v1/models/nope:predict")
        if kind == "bad_utf8":
            return _post(p, b'{"instances": ["caf\xe9"]}')
        if kind == "lone_surrogate":  # valid JSON, not UTF-8 text
            return _post(p, b'{"instances": ["\\ud800"]}')
        if kind == "huge_version":
            return _post(p, b'{"instances": ["a"]}', "/v1/models/sst2/versions/99999999999999999999:predict")
        if kind == "huge_length":
            return _raw(p, f"POST {_PREDICT} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 999999999\r\n\r\n".encode())
        if kind == "no_length":
            return _raw(p, f"POST {_PREDICT} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
        if kind == "cut_body":
            head = f"POST {_PREDICT} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 5000\r\n\r\n"
            return _raw(p, head.encode() + b'{"instances": [', read=False)
        if kind == "partial_header":
            return _raw(p, f"POST {_PREDICT} HTTP/1.1\r\nHo".encode(), read=False)
        if kind == "grpc_wrong_dtype":
            return self._grpc([1], "int32")
        if kind == "grpc_bad_utf8":
            return self._grpc([b"\xff\xfe"], object)
        raise ValueError(kind)


GOOD = ("rest_predict", "grpc_predict")
KINDS = ("rest_predict", "bad_json", "grpc_predict", "deep_json", "wrong_type", "rest_predict", "unknown_model",
         "bad_utf8", "grpc_predict", "huge_length", "no_length", "cut_body", "partial_header", "grpc_wrong_dtype",
         "grpc_bad_utf8", "lone_surrogate", "big_bad_json", "huge_version", "big_ragged")
EXPECTED = {"rest_predict": "200", "grpc_predict": "grpc OK", "bad_json": "400", "deep_json": "400",
            "wrong_type": "400", "unknown_model": "404", "bad_utf8": "400", "huge_length": "413", "no_length": "411",
            "cut_body": "hung up", "partial_header": "hung up", "grpc_wrong_dtype": "grpc INVALID_ARGUMENT",
            "grpc_bad_utf8": "grpc INVALID_ARGUMENT", "big_bad_json": "400", "big_ragged": "400", "lone_surrogate": "400",
            "huge_version": "400"}


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


# ------------------------------------------------------------------------------------------ the run
def export_model(base: Path, tokenizer_dir: str) -> None:
    """Version 1 of ``sst2``: the ``test`` preset, random weights, GPT-1's BPE."""
    from gpt_tf.config import get_size
    from gpt_tf.gpt1.backbone import GPT1Backbone
    from gpt_tf.task_model import GPTTaskModel
    from gpt_tf.tasks import get_task
    from serving.export import export_task_model

    task = get_task("sst2")
    model = GPTTaskModel(GPT1Backbone.from_gpt_config(get_size("test", vocab_size=40478), name="backbone"), task)
    export_task_model(model, task, tokenizer_dir, str(base), "sst2", version=1)


def start_server(base: Path, log_path: Path, extra: list[str], root: Path = ROOT):
    grpc_port, rest_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(root), "TF_CPP_MIN_LOG_LEVEL": "2"}
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "serving.server", "--model_name=sst2", f"--model_base_path={base / 'sst2'}",
                             f"--port={grpc_port}", f"--rest_api_port={rest_port}", "--file_system_poll_wait_seconds=0.5",
                             *extra], cwd=root, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    if "gRPC on" not in line:
        raise RuntimeError(f"the server did not start: {line!r}\n{log_path.read_text()[-2000:]}")
    return proc, log, grpc_port, rest_port


def drive(client: Client, kinds, offset: int, deadline: float, max_requests: int, results: list, lock) -> None:
    """One client thread: the kinds in turn until ``deadline`` or ``max_requests`` (bounded both ways)."""
    for i in range(max_requests):
        if time.monotonic() >= deadline:
            return
        send_one(client, kinds[(offset + i) % len(kinds)], results, lock)


def send_one(client: Client, kind: str, results: list, lock) -> None:
    """One request of ``kind``; ``(kind, outcome, seconds, when)`` appended to ``results`` (a client error counts)."""
    start = time.perf_counter()
    try:
        outcome = client.send(kind)
    except OSError as err:
        outcome = f"client {type(err).__name__}"
    with lock:
        results.append((kind, outcome, time.perf_counter() - start, time.monotonic()))


def percentile_ms(seconds, q):
    values = sorted(seconds)
    return round(1000 * values[min(len(values) - 1, int(q / 100 * len(values)))], 2) if values else None


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


def define_flags():
    from bench import _soak_day  # pylint: disable=import-outside-toplevel  (it imports this module)

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
    _soak_day.define_flags()


def main(argv) -> None:
    del argv  # everything is a flag
    if FLAGS.mode == "day":
        from bench._soak_day import day  # pylint: disable=import-outside-toplevel

        return day(FLAGS)
    soak(FLAGS)


def soak(args, run_fn=None, prefix: str = "soak_", root: Path | None = None) -> dict:
    """Exports a model, starts the server, runs the soak (``run_fn``: ``run``, or ``bench/_soak_day.py``'s day);
    the report as a dict."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        export_model(work / "models", args.tokenizer_dir)
        proc, log, grpc_port, rest_port = start_server(work / "models", work / "server.log", args.server_flag,
                                                           root or Path(args.server_root))
        try:
            return (run_fn or run)(args, proc, work, grpc_port, rest_port)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            log.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args, proc, work: Path, grpc_port: int, rest_port: int) -> dict:
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


if __name__ == "__main__":
    define_flags()
    app.run(main)
