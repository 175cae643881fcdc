"""Serving latency and throughput: gRPC (``serving.server``, batching on and off) vs the SavedModel in process.

Single-sentence classification (an SST-2 head on the ``small`` preset by default, GPT-1's 40,478-token
BPE, random weights: speed does not depend on them) at ~128 tokens per request, one example per
request. In one run it measures, at each concurrency (default 1 and 8, one thread per client):

* ``in-process``: ``tf.saved_model.load(...).signatures["serving_default"]`` called from the threads;
* ``grpc-batched``: ``python -m serving.server --enable_batching`` with
  ``serving/batching_parameters.txt``, one gRPC channel per client thread;
* ``grpc-unbatched``: the same server without batching;
* ``in-process-batch`` (at the highest concurrency N only): one thread calling the SavedModel with
  N texts at a time, i.e. what a perfectly filled server-side batch costs; its throughput (in
  examples/s) bounds what batching can gain over N unbatched clients.

The three are measured in interleaved rounds (each round runs every configuration once) so that a
load change on a shared machine hits them alike; each measurement also records the share of the
machine's CPU that other processes used meanwhile (from /proc). The texts are real SST-2 training
sentences joined to 120-128 BPE tokens, so a request's view is ~128 tokens plus <s> and <e>.

    python -m bench.serving_latency                      # writes bench/results/serving_latency.{json,md}
    python -m bench.serving_latency --preset=tiny --requests=200 --rounds=2

oneDNN's rewrites: ``--onednn=0`` / ``--onednn=1`` set ``TF_ENABLE_ONEDNN_OPTS`` for this process and its
servers (one value per run; two sequential runs see different loads). ``--onednn=ab`` measures both values
in one run, interleaved slot by slot, each value in its own processes (an in-process worker and two servers
per value, ``bench/_serving_ab.py``), and reports them side by side with the on / off ratio of p50 and
whether the faster value on served p50 agrees with ``gpt_tf.autotune.serving_default()`` on this CPU:

    python -m bench.serving_latency --onednn=ab --rounds=3   # bench/results/serving_latency_onednn_ab.{json,md}
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from absl import app, flags, logging

from bench.harness import ROOT, CpuMeter, header, machine_info

FLAGS = flags.FLAGS
DATA = ROOT.parent / "shared" / "data"
CONFIGS = ("in-process", "grpc-batched", "grpc-unbatched")
BATCH = "in-process-batch"


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


def spawn_server(base: Path, name: str, batching: bool, port: int, env: dict | None = None):
    """``python -m serving.server`` for ``base/name`` (``env``: extra variables); its stderr kept in a temp file."""
    args = [sys.executable, "-m", "serving.server", f"--model_base_path={base / name}", f"--model_name={name}",
            f"--port={port}", "--rest_api_port=0", "--file_system_poll_wait_seconds=0"]
    if batching:
        args += ["--enable_batching", f"--batching_parameters_file={ROOT / 'serving' / 'batching_parameters.txt'}"]
    path = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env = {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}  # this checkout first
    stderr = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    proc.stderr_file = stderr
    return proc


def server_port(proc) -> int:
    """The gRPC port a ``spawn_server`` process prints once its model is loaded (its stderr's tail if it fails)."""
    line = proc.stdout.readline()
    if "gRPC on" not in line:
        proc.stderr_file.seek(0)
        raise RuntimeError(f"serving.server did not start: {line!r}\n{proc.stderr_file.read()[-2000:]}")
    return int(line.split("gRPC on ")[1].split(",")[0].rsplit(":", 1)[1])


def start_server(base: Path, name: str, batching: bool, port: int):
    proc = spawn_server(base, name, batching, port)
    return proc, server_port(proc)


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


def grpc_caller(port: int, name: str, concurrency: int, texts: list):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    stubs = [prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
             for _ in range(concurrency)]

    def call(k, i):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = name
        request.inputs["sentence"].CopyFrom(tf.make_tensor_proto([texts[i % len(texts)]]))
        stubs[k].Predict(request, timeout=120)

    return call


def summary(latencies, wall, others) -> dict:
    ms = np.asarray(latencies) * 1e3
    return {"requests": len(ms), "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "throughput_rps": len(ms) / wall, "others_cpu": others}


def markdown(report: dict) -> str:
    r = report["results"]
    lines = [f"Measured {report['date']} on {report['machine']} ({report['cpus']} CPUs); model `{report['preset']}` preset "
             f"({report['params'] / 1e6:.1f}M parameters, GPT-1 BPE), SST-2 head, random weights; "
             f"{report['tokens_min']}-{report['tokens_max']} text tokens per request (+ <s>, <e>); "
             f"{report['rounds']} interleaved rounds; oneDNN rewrites {'on' if report.get('onednn_rewrites') else 'off'}.", "",
             f"Command: `{report['command']}`", "",
             "| configuration | concurrency | requests | p50 ms | p99 ms | p99 / p50 | throughput req/s | others' CPU |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    many = max(report["concurrency"])
    for c in report["concurrency"]:
        for name in CONFIGS + ((BATCH,) if c == many else ()):
            s = r[f"{name}@{c}"]
            label = f"{name} (calls of {many} texts; examples/s)" if name == BATCH else name
            lines.append(f"| {label} | {1 if name == BATCH else c} | {s['requests']} | {s['p50_ms']:.1f} | "
                         f"{s['p99_ms']:.1f} | {s['p99_ms'] / s['p50_ms']:.2f} | {s['throughput_rps']:.1f} | "
                         f"{s['others_cpu']:.0%} |")
    checks = report["checks"]
    lines += ["", "| aim | measured | met |", "|---|---:|---|"]
    for key, (value, aim, met) in checks.items():
        lines.append(f"| {key} (aim {aim}) | {value:.2f} | {'yes' if met else 'no'} |")
    for key, value in report["ceiling"].items():
        lines.append(f"| batching's ceiling: {key} | {value:.2f} | |")
    return "\n".join(lines) + "\n"


def define_flags():
    flags.DEFINE_string("preset", "small", "the model size to serve (gpt_tf/config.py)")
    flags.DEFINE_integer("requests", 120, "requests per configuration, concurrency, round")
    flags.DEFINE_integer("rounds", 6, "rounds over the configurations")
    flags.DEFINE_string("concurrency", "1,8", "comma-separated client concurrencies")
    flags.DEFINE_integer("warmup", 16, "untimed requests per configuration first")
    flags.DEFINE_string("tokens", "120,128", "text length range in BPE tokens")
    flags.DEFINE_string("out", str(ROOT / "bench" / "results" / "serving_latency.json"), "the JSON report (.md beside it)")
    flags.DEFINE_enum("onednn", None, ["0", "1", "ab"], "TF_ENABLE_ONEDNN_OPTS for this process and its servers "
                      "(default: the serving default, gpt_tf/autotune.py); ab: both values in one run, interleaved, "
                      "each in its own processes (bench/_serving_ab.py; default --out serving_latency_onednn_ab.json)")
    flags.DEFINE_string("worker", None, "internal: run as an in-process worker of --onednn=ab with this JSON spec")


def local_caller(tf, signature, texts: list, size: int):
    """``call(k, i)``: the SavedModel's signature on ``size`` texts (call ``i``'s, in the order of ``texts``)."""
    return lambda k, i: signature(sentence=tf.constant([texts[(i * size + j) % len(texts)] for j in range(size)]))


def prepare(args):
    """TensorFlow (the process's settings), the texts, the model config and its export in a temp folder."""
    from gpt_tf.console import import_tensorflow

    tf = import_tensorflow(serving=True)
    from gpt_tf.config import get_size
    from gpt_tf.gpt1.backbone import GPT1Backbone
    from gpt_tf.task_model import GPTTaskModel
    from gpt_tf.tasks import get_task
    from gpt_tf.text.tokenizer import GPTTokenizer
    from serving.export import export_task_model

    low, high = (int(x) for x in args.tokens.split(","))
    tokenizer = GPTTokenizer.from_dir(DATA / "gpt1_bpe")
    texts = sst2_texts(tokenizer, 64, low, high)
    config = get_size(args.preset, vocab_size=tokenizer.vocab_size)
    base = Path(tempfile.mkdtemp(prefix="serving_bench_"))
    task = get_task("sst2")
    export_task_model(GPTTaskModel(GPT1Backbone.from_gpt_config(config, name="backbone"), task), task, str(DATA / "gpt1_bpe"),
                      str(base), "sst2")
    return SimpleNamespace(tf=tf, texts=texts, config=config, base=base, low=low, high=high,
                           concurrency=[int(c) for c in args.concurrency.split(",")])


def main(argv):
    del argv  # everything is a flag
    args = FLAGS
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # the export's INFO lines off, as in the project's commands
    if args.worker:
        from bench._serving_ab import worker_main

        return worker_main(json.loads(args.worker))
    if args.onednn in ("0", "1"):
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = args.onednn  # before TensorFlow starts, here and in the servers
    setup = prepare(args)
    if args.onednn == "ab":
        from bench._serving_ab import DEFAULT_OUT, run_ab

        run_ab(args, setup, Path(args.out) if FLAGS["out"].present else DEFAULT_OUT)
        return None  # absl exits 0
    from tensorflow.python.util import _pywrap_util_port

    tf, texts, config, base, concurrency = setup.tf, setup.texts, setup.config, setup.base, setup.concurrency
    low, high = setup.low, setup.high
    signature = tf.saved_model.load(str(base / "sst2" / "1")).signatures["serving_default"]
    servers = {"grpc-batched": start_server(base, "sst2", True, 0), "grpc-unbatched": start_server(base, "sst2", False, 0)}
    try:
        many = max(concurrency)
        callers = {"in-process": local_caller(tf, signature, texts, 1), BATCH: local_caller(tf, signature, texts, many)}
        meter_pids = [os.getpid()] + [proc.pid for proc, _ in servers.values()]
        samples = {f"{n}@{c}": ([], 0.0, []) for n in CONFIGS for c in concurrency}
        samples[f"{BATCH}@{many}"] = ([], 0.0, [])
        for c in concurrency:
            for name, (_, port) in servers.items():
                callers[(name, c)] = grpc_caller(port, "sst2", c, texts)
        for rnd in range(args.rounds):
            for c in concurrency:
                for name in CONFIGS + ((BATCH,) if c == many else ()):
                    call = callers[name] if name in callers else callers[(name, c)]
                    threads, requests = (1, args.requests // c) if name == BATCH else (c, args.requests)
                    if rnd == 0:
                        run_load(call, max(args.warmup, threads), threads)
                    meter = CpuMeter(meter_pids)
                    meter.start()
                    latencies, wall = run_load(call, requests, threads)
                    others = meter.stop()
                    got = samples[f"{name}@{c}"]
                    samples[f"{name}@{c}"] = (got[0] + latencies, got[1] + wall, got[2] + [others])
                    print(f"round {rnd + 1} {name} x{c}: p50 {np.percentile(latencies, 50) * 1e3:.1f} ms, "
                          f"{len(latencies) / wall:.1f} calls/s, others' CPU {others:.0%}", flush=True)
    finally:
        for proc, _ in servers.values():
            stop_server(proc)
    results = {k: summary(lat, wall, float(np.mean(o))) for k, (lat, wall, o) in samples.items()}
    results[f"{BATCH}@{many}"]["throughput_rps"] *= many  # examples/s: each call carries `many` texts
    one, many = min(concurrency), max(concurrency)
    ratio_p50 = results[f"grpc-batched@{one}"]["p50_ms"] / results[f"in-process@{one}"]["p50_ms"]
    tail = results[f"grpc-batched@{one}"]["p99_ms"] / results[f"grpc-batched@{one}"]["p50_ms"]
    gain = results[f"grpc-batched@{many}"]["throughput_rps"] / results[f"grpc-unbatched@{many}"]["throughput_rps"]
    ceiling = results[f"{BATCH}@{many}"]["throughput_rps"] / results[f"in-process@{many}"]["throughput_rps"]
    report = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "machine": header(machine_info()),
        "onednn_rewrites": bool(_pywrap_util_port.IsMklEnabled()),
        "cpus": os.cpu_count(), "preset": args.preset, "params": config.n_params, "tokens_min": low, "tokens_max": high,
        "rounds": args.rounds, "concurrency": concurrency, "command": "python -m bench.serving_latency " + " ".join(sys.argv[1:]),
        "results": results,
        "checks": {f"gRPC p50 / in-process p50 at concurrency {one}": (ratio_p50, "<= 1.1", ratio_p50 <= 1.1),
                   f"gRPC p99 / p50 at concurrency {one}": (tail, "<= 1.5", tail <= 1.5),
                   f"batched / unbatched throughput at concurrency {many}": (gain, ">= 1.5", gain >= 1.5)},
        "ceiling": {f"in-process one batch of {many} / {many} in-process threads, examples/s": ceiling},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    define_flags()
    app.run(main)
