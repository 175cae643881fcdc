"""What the serving benchmarks (``serving_latency``, ``soak``) share: a model to serve, server processes, clients.

* ``export_sst2``: an SST-2 classifier of a preset's shape with random weights (speed and robustness do not depend
  on them) and GPT-1's BPE, exported as ``<base>/sst2/1``. ``Exported``: one at GPT-1's size exported by
  ``serving.export.export_task_at`` and predicting in process (``bench.costs --mode=gpt1``'s serving).
* ``spawn_server`` / ``server_port`` / ``stop_server``: ``python -m serving.server`` of a checkout in its own
  process (its gRPC port read from its start-up line), stopped gracefully, killed if it hangs, so that no server
  outlives a run. ``server_stats``: a process's RSS, threads and open files (Linux ``/proc``); ``CpuMeter``: the
  share of the machine's CPU other processes used around a server and its clients.
* Load: ``sst2`` (SST-2's texts and labels, the project's reader), ``sst2_texts`` (real SST-2 sentences joined to a
  length in tokens), ``run_load`` (N calls over k threads,
  the latencies and the wall time), ``percentile_ms``.
* ``Client``: one client thread's connections and the request kinds of ``KINDS``, good (REST and gRPC predictions,
  ``GOOD``) and malformed (bad JSON, 1 MB of it, JSON nested 1,000 deep, a ragged 1 MB array, wrong types, an
  unknown model, invalid UTF-8, a lone surrogate, a version past 64 bits, a Content-Length of 999,999,999 without a
  body, no Content-Length, a body cut off, a partial header then a hang-up, gRPC wrong dtype / invalid UTF-8), each
  with the answer it must get (``EXPECTED``); ``send_one`` / ``drive`` record outcomes. Every request goes to
  127.0.0.1.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.harness import ROOT, busy_seconds

DATA = ROOT.parent / "shared" / "data"
HOST = "127.0.0.1"
TEXT = "a gripping, funny and touching film"
_PREDICT = "/v1/models/sst2:predict"


def export_sst2(base: Path, preset: str, tokenizer_dir, vocab_size: int, weights: str = "float32"):
    """Version 1 of ``base/sst2``: an SST-2 task model of ``preset``'s shape, random weights (held in ``weights``:
    ``serving.export --weights``); returns its config."""
    from gpt_tf.config import get_size
    from gpt_tf.gpt1.backbone import GPT1Backbone
    from gpt_tf.gpt1.text_classifier import task_for_spec
    from gpt_tf.tasks import get_task
    from serving.export import export_task_model, in_weights

    task, config = get_task("sst2"), get_size(preset, vocab_size=vocab_size)
    model = in_weights(task_for_spec(GPT1Backbone.from_gpt_config(config, name="backbone"), task), weights)
    export_task_model(model, task, str(tokenizer_dir), str(base), "sst2", version=1)
    return config


class Exported:
    """A GPT-1-size ``GPT1TextClassifier`` (random weights, GPT-1's BPE) exported by ``serving.export.export_task_at``
    and loaded back: ``evaluate()`` predicts SST-2's dev sentences in batches through ``serving_default``, in process
    (``bench.costs --mode=gpt1``'s serving, a ``_finetune_stacks`` worker's stack)."""

    def __init__(self, spec):
        import keras
        import tensorflow as tf

        import gpt_tf
        from gpt_tf.config import get_size
        from serving.export import export_task_at

        if spec["precision"] != "float32":
            keras.mixed_precision.set_dtype_policy(spec["precision"])
        keras.utils.set_random_seed(0)
        preprocessor = gpt_tf.GPT1TaskPreprocessor(gpt_tf.GPT1Tokenizer(spec["tokenizer_dir"]),
                                                   sequence_length=spec["n_ctx"])
        backbone = gpt_tf.GPT1Backbone.from_gpt_config(get_size("gpt1", n_ctx=spec["n_ctx"]))
        model = gpt_tf.GPT1TextClassifier(backbone, 2, preprocessor, compile=False)
        start = time.perf_counter()
        path = export_task_at(model, tempfile.mkdtemp(prefix="costs_export_") + "/model")
        self.serve = tf.saved_model.load(path).signatures["serving_default"]
        self.texts, self.batch_size = sst2(spec["glue_dir"], "dev")[0], spec["batch_size"]
        self.info = {"export_s": round(time.perf_counter() - start, 1), "examples": len(self.texts)}

    def evaluate(self) -> dict:
        import tensorflow as tf

        for i in range(0, len(self.texts), self.batch_size):
            out = self.serve(sentence=tf.constant(self.texts[i:i + self.batch_size]))
        _ = [v.numpy() for v in out.values()]  # waits for the last batch
        return {"examples": len(self.texts)}


# ----------------------------------------------------------------------------- server processes


def spawn_server(base: Path, name: str, *server_flags: str, env: dict | None = None, root: Path = ROOT,
                 log: Path | None = None):
    """``python -m serving.server`` of checkout ``root`` for ``base/name`` with ``server_flags`` (``env``: extra
    variables); its stderr to ``log`` or a temporary file (``proc.stderr_file``)."""
    args = [sys.executable, "-m", "serving.server", f"--model_base_path={base / name}", f"--model_name={name}",
            *server_flags]
    path = os.pathsep.join([str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env = {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}  # that checkout first
    stderr = open(log, "w+") if log else tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by stop_server)
    proc = subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    proc.stderr_file = stderr
    return proc


def server_port(proc) -> int:
    """The gRPC port a ``spawn_server`` process prints once its model is loaded (its stderr's tail if it fails)."""
    line = proc.stdout.readline()
    if "gRPC on" not in line:
        proc.stderr_file.seek(0)
        raise RuntimeError(f"serving.server did not start: {line!r}\n{proc.stderr_file.read()[-2000:]}")
    return int(line.split("gRPC on ")[1].split(",")[0].rsplit(":", 1)[1])


def stop_server(proc, timeout: float = 60) -> None:
    """SIGTERM (the server's graceful stop), SIGKILL after ``timeout`` s, so that no server outlives the run."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.stderr_file.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def server_stats(pid: int) -> dict:
    """RSS (MB), threads and open file descriptors of a process (Linux /proc)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {"rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1), "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


class CpuMeter:
    """Share of the machine's CPU used by processes other than ``pids`` (a server and its clients) between start()
    and stop()."""

    def __init__(self, pids):
        self.pids = pids

    def _ours(self):
        total = 0
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read().rsplit(")", 1)[1].split()
                total += (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
            except OSError:
                pass
        return total

    def start(self):
        self._t, self._b, self._o = time.monotonic(), busy_seconds(), self._ours()

    def stop(self) -> float:
        available = (time.monotonic() - self._t) * (os.cpu_count() or 1)
        return max(0.0, (busy_seconds() - self._b) - (self._ours() - self._o)) / available


# ----------------------------------------------------------------------------- load


def sst2(glue_dir: str, split: str, limit: int = 0):
    """SST-2's texts and labels of ``split`` as the project reads them (``gpt_tf.data.task_readers``), the first
    ``limit`` (0: all)."""
    from gpt_tf.data.task_readers import read_examples
    from gpt_tf.tasks import get_task

    examples = read_examples(get_task("sst2"), Path(glue_dir) / "SST-2", split)[0]
    examples = examples[:limit] if limit else examples
    return [e.text_a for e in examples], [e.label for e in examples]


def sst2_texts(tokenizer, count: int, low: int, high: int) -> list:
    """``count`` distinct texts of ``low``..``high`` tokens made of consecutive SST-2 training sentences."""
    rows = (DATA / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    sentences = [row.split("\t")[0].strip() for row in rows if row.count("\t") == 1]
    texts, current = [], []
    for sentence in sentences:
        n = len(tokenizer.encode(" ".join(current + [sentence])))
        if n <= high:
            current.append(sentence)
            if n >= low:
                texts.append(" ".join(current))
                current = []
        else:
            current = []
        if len(texts) == count:
            return texts
    raise ValueError(f"SST-2 gave only {len(texts)} texts of {low}..{high} tokens")


def run_load(call, requests: int, concurrency: int) -> tuple:
    """Latencies (s) of ``requests`` calls spread over ``concurrency`` threads, and the wall time.

    ``call(k, i)`` sends request ``i`` from thread ``k``."""
    latencies, errors = [], []
    per_thread = requests // concurrency

    def worker(k):
        own = []
        for i in range(per_thread):
            t0 = time.perf_counter()
            try:
                call(k, k * per_thread + i)
            except Exception as err:  # noqa: BLE001 -- counted and reported
                errors.append(repr(err))
            own.append(time.perf_counter() - t0)
        latencies.extend(own)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, e.g. {errors[0]}")
    return latencies, wall


def percentile_ms(seconds, q):
    values = sorted(seconds)
    return round(1000 * values[min(len(values) - 1, int(q / 100 * len(values)))], 2) if values else None


# ----------------------------------------------------------------------------- good and malformed requests


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
            "grpc_bad_utf8": "grpc INVALID_ARGUMENT", "big_bad_json": "400", "big_ragged": "400",
            "lone_surrogate": "400", "huge_version": "400"}


def send_one(client: Client, kind: str, results: list, lock) -> None:
    """One request of ``kind``; ``(kind, outcome, seconds, when)`` appended to ``results`` (a client error counts)."""
    start = time.perf_counter()
    try:
        outcome = client.send(kind)
    except OSError as err:
        outcome = f"client {type(err).__name__}"
    with lock:
        results.append((kind, outcome, time.perf_counter() - start, time.monotonic()))


def drive(client: Client, kinds, offset: int, deadline: float, max_requests: int, results: list, lock) -> None:
    """One client thread: the kinds in turn until ``deadline`` or ``max_requests`` (bounded both ways)."""
    for i in range(max_requests):
        if time.monotonic() >= deadline:
            return
        send_one(client, kinds[(offset + i) % len(kinds)], results, lock)
