"""Serving latency and throughput: gRPC (``serving.server``, batching on and off) vs the SavedModel in process.

    python -m bench.serving_latency                      # writes bench/results/serving_latency.{json,md}
    python -m bench.serving_latency --preset=tiny --requests=200 --rounds=2
    python -m bench.serving_latency --onednn=ab --rounds=3   # bench/results/serving_latency_onednn_ab.{json,md}
    python -m bench.serving_latency --weights=int8 --concurrency=1,32   # the export's weights in int8 (one per run)

Single-sentence classification (an SST-2 head on the ``small`` preset by default, GPT-1's 40,478-token BPE, random
weights: speed does not depend on them) at ~128 tokens per request, one example per request: real SST-2 training
sentences joined to 120-128 BPE tokens, so a request's view is ~128 tokens plus <s> and <e>. At each concurrency
(default 1 and 8, one thread per client):

* ``in-process``: ``tf.saved_model.load(...).signatures["serving_default"]`` called from the threads;
* ``grpc-batched``: ``python -m serving.server --enable_batching`` with ``serving/batching_parameters.txt``, one
  gRPC channel per client thread;
* ``grpc-unbatched``: the same server without batching;
* ``in-process-batch`` (at the highest concurrency N only): one thread calling the SavedModel with N texts at a
  time, i.e. what a perfectly filled server-side batch costs; its throughput (in examples/s) bounds what batching
  can gain over N unbatched clients.

The configurations run in interleaved rounds (each round runs every configuration once) so that a load change on a
shared machine hits them alike; each measurement also records the share of the machine's CPU that processes other
than ours used meanwhile (from /proc).

oneDNN's rewrites: ``--onednn=0`` / ``--onednn=1`` set ``TF_ENABLE_ONEDNN_OPTS`` for this process and its servers
(one value per run; two sequential runs see different loads). ``--onednn=ab`` measures both values in one run. The
variable acts only when TensorFlow starts, so each value gets its own processes, started with it set: an in-process
worker (``harness.Worker``: the SavedModel loaded and called in it; it reports the variable and ``IsMklEnabled()``
as it saw them) and two servers (batching on and off; the variable read back from ``/proc/<pid>/environ``). Every
slot (configuration x concurrency) is measured with both values back to back, off then on in odd rounds, on then
off in even ones (``schedule``), the gRPC slots from the same client threads (this process, with the serving
default: it only builds requests). The report gives p50 / p99 ms and req/s off and on side by side, the on / off
ratio of p50, and the verdict: which value is faster on served (gRPC) p50 in most rows here, against
``gpt_tf.speed.autotune.serving_default()`` on this CPU.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from absl import app, flags, logging

from bench._servers import DATA, CpuMeter, export_sst2, run_load, server_port, spawn_server, sst2_texts, stop_server
from bench.harness import ROOT, Worker, emit, header, machine_info, save_report

FLAGS = flags.FLAGS
CONFIGS = ("in-process", "grpc-batched", "grpc-unbatched")
BATCH = "in-process-batch"
SERVED = ("grpc-batched", "grpc-unbatched")
ONEDNN = "TF_ENABLE_ONEDNN_OPTS"
SETTINGS = ("0", "1")
LABEL = {"0": "off", "1": "on"}


def slots(concurrency: list) -> list:
    """``(configuration, concurrency)`` in the order a round measures them; ``BATCH`` at the highest concurrency."""
    many = max(concurrency)
    return [(name, c) for c in concurrency for name in CONFIGS + ((BATCH,) if c == many else ())]


def schedule(rounds: int, concurrency: list, values=SETTINGS) -> list:
    """``(round, configuration, concurrency, value)`` in the order measured: each slot with every value back to
    back, in ``values``' order in rounds 1, 3, ..., reversed in rounds 2, 4, ... (``--onednn=ab``: off first, then
    on first)."""
    return [(rnd, name, c, value) for rnd in range(rounds) for name, c in slots(concurrency)
            for value in (values if rnd % 2 == 0 else values[::-1])]


def measure(order: list, load, pids: list, args) -> tuple[dict, list]:
    """Runs ``order``'s slots, ``load(name, c, value, requests, threads)`` -> (latencies, wall), each key warmed up
    before its first slot (untimed); returns ``{(name, c, value): (latencies, wall, others' CPU shares)}`` and a
    line per slot."""
    samples, measured, warmed = {}, [], set()
    for rnd, name, c, value in order:
        threads, requests = (1, args.requests // c) if name == BATCH else (c, args.requests)
        if (name, c, value) not in warmed:
            load(name, c, value, max(args.warmup, threads), threads)
            warmed.add((name, c, value))
        meter = CpuMeter(pids)
        meter.start()
        latencies, wall = load(name, c, value, requests, threads)
        others = meter.stop()
        lat, total, shares = samples.get((name, c, value), ([], 0.0, []))
        samples[name, c, value] = (lat + latencies, total + wall, shares + [others])
        p50 = float(np.percentile(latencies, 50) * 1e3)
        measured.append({"round": rnd + 1, "configuration": name, "concurrency": c, "onednn": LABEL.get(value),
                         "p50_ms": p50, "others_cpu": others})
        print(f"round {rnd + 1} {name} x{c}{f' oneDNN {LABEL[value]}' if value else ''}: p50 {p50:.1f} ms, "
              f"{len(latencies) / wall:.1f} calls/s, others' CPU {others:.0%}", flush=True)
    return samples, measured


def summaries(samples: dict, many: int) -> dict:
    """``{(name, c, value): p50 / p99 / mean ms, throughput, others' CPU}``; ``BATCH``'s throughput in examples/s."""
    out = {}
    for (name, c, value), (latencies, wall, shares) in samples.items():
        ms = np.asarray(latencies) * 1e3
        out[name, c, value] = {"requests": len(ms), "p50_ms": float(np.percentile(ms, 50)),
                               "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean()),
                               "throughput_rps": len(ms) / wall * (many if name == BATCH else 1),
                               "others_cpu": float(np.mean(shares))}
    return out


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


def local_caller(tf, signature, texts: list, size: int):
    """``call(k, i)``: the SavedModel's signature on ``size`` texts (call ``i``'s, in the order of ``texts``)."""
    return lambda k, i: signature(sentence=tf.constant([texts[(i * size + j) % len(texts)] for j in range(size)]))


def start_servers(base: Path, env: dict | None = None) -> dict:
    """The batched and the unbatched server of ``base/sst2`` (started together: their start-ups overlap)."""
    common = ["--port=0", "--rest_api_port=0", "--file_system_poll_wait_seconds=0"]
    batching = ["--enable_batching", f"--batching_parameters_file={ROOT / 'serving' / 'batching_parameters.txt'}"]
    return {name: spawn_server(base, "sst2", *common, *(batching if name == "grpc-batched" else []), env=env)
            for name in SERVED}


def prepare(args):
    """TensorFlow (the process's settings), the texts, the model config and its export in a temp folder."""
    from gpt_tf.console import import_tensorflow

    tf = import_tensorflow(serving=True)
    from gpt_tf.text.tokenizer import GPTTokenizer

    low, high = (int(x) for x in args.tokens.split(","))
    tokenizer = GPTTokenizer.from_dir(DATA / "gpt1_bpe")
    base = Path(tempfile.mkdtemp(prefix="serving_bench_"))
    config = export_sst2(base, args.preset, DATA / "gpt1_bpe", tokenizer.vocab_size, args.weights)
    return SimpleNamespace(tf=tf, texts=sst2_texts(tokenizer, 64, low, high), config=config, base=base, low=low,
                           high=high, concurrency=[int(c) for c in args.concurrency.split(",")])


def report_head(args, setup) -> dict:
    return {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "preset": args.preset, "weights": args.weights,
            "params": setup.config.n_params, "tokens_min": setup.low, "tokens_max": setup.high, "rounds": args.rounds,
            "concurrency": setup.concurrency, "command": "python -m bench.serving_latency " + " ".join(sys.argv[1:])}


def row_label(name: str, c: int, many: int) -> str:
    """A table row's first two cells: the configuration and its concurrency."""
    return (f"{name} (calls of {many} texts; examples/s) | 1" if name == BATCH else f"{name} | {c}")


# ----------------------------------------------------------------------------- one value of the rewrites per run


def run_one_value(args, setup) -> dict:
    from tensorflow.python.util import _pywrap_util_port

    tf, texts, concurrency, many = setup.tf, setup.texts, setup.concurrency, max(setup.concurrency)
    signature = tf.saved_model.load(str(setup.base / "sst2" / "1")).signatures["serving_default"]
    servers = start_servers(setup.base)
    try:
        ports = {name: server_port(proc) for name, proc in servers.items()}
        local = {"in-process": local_caller(tf, signature, texts, 1), BATCH: local_caller(tf, signature, texts, many)}
        grpc = {(name, c): grpc_caller(ports[name], "sst2", c, texts) for name in SERVED for c in concurrency}
        load = lambda name, c, _, n, threads: run_load(local.get(name) or grpc[name, c], n, threads)  # noqa: E731
        pids = [os.getpid()] + [proc.pid for proc in servers.values()]
        samples, _ = measure(schedule(args.rounds, concurrency, values=(None,)), load, pids, args)
    finally:
        for proc in servers.values():
            stop_server(proc)
    results = {f"{name}@{c}": s for (name, c, _), s in summaries(samples, many).items()}
    one = min(concurrency)
    ratio_p50 = results[f"grpc-batched@{one}"]["p50_ms"] / results[f"in-process@{one}"]["p50_ms"]
    tail = results[f"grpc-batched@{one}"]["p99_ms"] / results[f"grpc-batched@{one}"]["p50_ms"]
    gain = results[f"grpc-batched@{many}"]["throughput_rps"] / results[f"grpc-unbatched@{many}"]["throughput_rps"]
    ceiling = results[f"{BATCH}@{many}"]["throughput_rps"] / results[f"in-process@{many}"]["throughput_rps"]
    return {**report_head(args, setup), "machine": machine_info(), "cpus": os.cpu_count(),
            "onednn_rewrites": bool(_pywrap_util_port.IsMklEnabled()), "results": results,
            "checks": {f"gRPC p50 / in-process p50 at concurrency {one}": (ratio_p50, "<= 1.1", ratio_p50 <= 1.1),
                       f"gRPC p99 / p50 at concurrency {one}": (tail, "<= 1.5", tail <= 1.5),
                       f"batched / unbatched throughput at concurrency {many}": (gain, ">= 1.5", gain >= 1.5)},
            "ceiling": {f"in-process one batch of {many} / {many} in-process threads, examples/s": ceiling}}


def markdown(report: dict) -> str:
    r, many = report["results"], max(report["concurrency"])
    rewrites = "on" if report.get("onednn_rewrites") else "off"
    lines = [f"Measured {report['date']} on {header(report['machine'])} ({report['cpus']} CPUs); model "
             f"`{report['preset']}` preset ({report['params'] / 1e6:.1f}M parameters, GPT-1 BPE), SST-2 head, random "
             f"weights held in {report.get('weights', 'float32')}; {report['tokens_min']}-{report['tokens_max']} text "
             f"tokens per request (+ <s>, <e>); {report['rounds']} interleaved rounds; oneDNN rewrites {rewrites}.", "",
             f"Command: `{report['command']}`", "",
             "| configuration | concurrency | requests | p50 ms | p99 ms | p99 / p50 | throughput req/s "
             "| others' CPU |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, c in slots(report["concurrency"]):
        s = r[f"{name}@{c}"]
        lines.append(f"| {row_label(name, c, many)} | {s['requests']} | {s['p50_ms']:.1f} | {s['p99_ms']:.1f} | "
                     f"{s['p99_ms'] / s['p50_ms']:.2f} | {s['throughput_rps']:.1f} | {s['others_cpu']:.0%} |")
    lines += ["", "| aim | measured | met |", "|---|---:|---|"]
    lines += [f"| {key} (aim {aim}) | {value:.2f} | {'yes' if met else 'no'} |"
              for key, (value, aim, met) in report["checks"].items()]
    lines += [f"| batching's ceiling: {key} | {value:.2f} | |" for key, value in report["ceiling"].items()]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- --onednn=ab


def worker_main(spec: dict) -> None:
    """An A/B in-process worker: loads the SavedModel (TensorFlow started with this process's variable), reports
    what it saw, then runs one load per stdin line (``{"size", "requests", "threads"}``): latencies and wall time."""
    from gpt_tf.console import import_tensorflow

    tf = import_tensorflow(serving=True)
    from tensorflow.python.util import _pywrap_util_port

    signature = tf.saved_model.load(spec["model"]).signatures["serving_default"]
    texts = json.loads(Path(spec["texts"]).read_text(encoding="utf-8"))
    emit("READY", {"pid": os.getpid(), "env": os.environ.get(ONEDNN),
                   "mkl_enabled": bool(_pywrap_util_port.IsMklEnabled())})
    for line in sys.stdin:
        job = json.loads(line)
        latencies, wall = run_load(local_caller(tf, signature, texts, job["size"]), job["requests"], job["threads"])
        emit("RESULT", {"latencies": latencies, "wall": wall})


def environ_of(pid: int) -> dict:
    """The environment process ``pid`` was started with (Linux ``/proc``)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode("utf-8", "replace").split("\0") if "=" in item)


def run_ab(args, setup) -> dict:
    """Both values' processes started, ``schedule``'s slots measured, all stopped; the report."""
    base, texts, concurrency, many = setup.base, setup.texts, setup.concurrency, max(setup.concurrency)
    (base / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    spec = {"model": str(base / "sst2" / "1"), "texts": str(base / "texts.json")}
    workers, servers = {}, {}
    try:
        for value in SETTINGS:  # all started at once: their start-ups overlap
            workers[value] = Worker(spec, "bench.serving_latency", env={ONEDNN: value})
            servers.update({(name, value): proc for name, proc in start_servers(base, {ONEDNN: value}).items()})
        ports = {key: server_port(proc) for key, proc in servers.items()}
        seen = {f"in-process/{LABEL[v]}": {**worker.read("READY"), "kind": "in-process worker"}
                for v, worker in workers.items()}
        seen.update({f"{name}/{LABEL[v]}": {"pid": proc.pid, "env": environ_of(proc.pid).get(ONEDNN), "kind": "server"}
                     for (name, v), proc in servers.items()})
        print("processes: " + ", ".join(f"{k} {ONEDNN}={s['env']}" + (f" IsMklEnabled={s['mkl_enabled']}"
                                                                      if "mkl_enabled" in s else "")
                                        for k, s in seen.items()), flush=True)
        callers = {(name, c, v): grpc_caller(ports[name, v], "sst2", c, texts)
                   for (name, v) in servers for c in concurrency}

        def load(name, c, value, n, threads):
            if name in SERVED:
                return run_load(callers[name, c, value], n, threads)
            ask = {"size": many if name == BATCH else 1, "requests": n, "threads": threads}
            got = workers[value].ask(json.dumps(ask), "RESULT")
            return got["latencies"], got["wall"]

        pids = [os.getpid()] + [w.proc.pid for w in workers.values()] + [p.pid for p in servers.values()]
        samples, measured = measure(schedule(args.rounds, concurrency), load, pids, args)
    finally:
        for proc in servers.values():  # every server told at once, so that their graceful stops overlap
            if proc.poll() is None:
                proc.terminate()
        for worker in workers.values():
            worker.close()
        for proc in servers.values():
            stop_server(proc)
        shutil.rmtree(base, ignore_errors=True)
    from gpt_tf.speed.autotune import serving_default

    results = {}
    for (name, c, value), s in summaries(samples, many).items():
        results.setdefault(f"{name}@{c}", {})[LABEL[value]] = s
    for row in results.values():
        row["on_off_p50"] = row["on"]["p50_ms"] / row["off"]["p50_ms"]
    served = [key for key in results if key.split("@")[0] in SERVED]
    on_faster = sum(results[key]["on"]["p50_ms"] < results[key]["off"]["p50_ms"] for key in served)
    faster = "on" if 2 * on_faster > len(served) else "off" if 2 * on_faster < len(served) else None
    default = LABEL[serving_default()[ONEDNN]]
    if faster:
        wins = on_faster if faster == "on" else len(served) - on_faster
        verdict = (f"Served (gRPC) p50: rewrites {faster} faster in {wins} of {len(served)} rows on this machine; "
                   f"`gpt_tf.speed.autotune.serving_default()` here picks {default}: "
                   f"{'agrees' if faster == default else 'disagrees'}.")
    else:
        verdict = (f"Served (gRPC) p50: a tie, rewrites on faster in {on_faster} of {len(served)} rows; "
                   f"`gpt_tf.speed.autotune.serving_default()` here picks {default}: neither agrees nor disagrees.")
    return {**report_head(args, setup), "machine": machine_info(), "processes": seen, "measured": measured,
            "results": results, "verdict": {"served_rows": len(served), "on_faster_rows": on_faster, "faster": faster,
                                            "serving_default": default,
                                            "agrees": faster == default if faster else None, "text": verdict}}


def ab_markdown(report: dict) -> str:
    seen, many = report["processes"], max(report["concurrency"])
    mkl = ", ".join(f"{k}: {s['mkl_enabled']}" for k, s in seen.items() if "mkl_enabled" in s)
    lines = [f"Measured {report['date']} on {header(report['machine'])}; model `{report['preset']}` preset "
             f"({report['params'] / 1e6:.1f}M parameters, GPT-1 BPE), SST-2 head, random weights; "
             f"weights held in {report.get('weights', 'float32')}; "
             f"{report['tokens_min']}-{report['tokens_max']} text tokens per request (+ <s>, <e>); "
             f"{report['rounds']} rounds, oneDNN rewrites off and on interleaved slot by slot (off first in odd "
             f"rounds, on first in even ones), each value in its own processes (`IsMklEnabled()` in the "
             f"in-process workers: {mkl}).", "", f"Command: `{report['command']}`", "",
             "| configuration | concurrency | p50 ms off | p50 ms on | on / off p50 | p99 ms off | p99 ms on "
             "| req/s off | req/s on | others' CPU off / on |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, c in slots(report["concurrency"]):
        row = report["results"][f"{name}@{c}"]
        off, on = row["off"], row["on"]
        lines.append(f"| {row_label(name, c, many)} | {off['p50_ms']:.1f} | {on['p50_ms']:.1f} "
                     f"| {row['on_off_p50']:.2f} | {off['p99_ms']:.1f} | {on['p99_ms']:.1f} "
                     f"| {off['throughput_rps']:.1f} | {on['throughput_rps']:.1f} "
                     f"| {off['others_cpu']:.0%} / {on['others_cpu']:.0%} |")
    return "\n".join(lines + ["", report["verdict"]["text"]]) + "\n"


def define_flags():
    flags.DEFINE_string("preset", "small", "the model preset to serve")
    flags.DEFINE_integer("requests", 120, "requests per configuration, concurrency, round")
    flags.DEFINE_integer("rounds", 6, "rounds over the configurations")
    flags.DEFINE_string("concurrency", "1,8", "comma-separated client concurrencies")
    flags.DEFINE_integer("warmup", 16, "untimed requests per configuration first")
    flags.DEFINE_string("tokens", "120,128", "text length range in BPE tokens")
    flags.DEFINE_string("out", str(ROOT / "bench" / "results" / "serving_latency.json"),
                        "the JSON report (.md beside it)")
    flags.DEFINE_enum("onednn", None, ["0", "1", "ab"], "TF_ENABLE_ONEDNN_OPTS for this process and its servers "
                      "(default: the serving default, gpt_tf/speed/autotune.py); ab: both values in one run, "
                      "interleaved, each in its own processes (default --out serving_latency_onednn_ab.json)")
    flags.DEFINE_enum("weights", "float32", ["float32", "bfloat16", "int8", "int8_weight_only"], "the export's "
                      "weights (serving.export --weights); the report's default name gains _<weights>")
    flags.DEFINE_string("worker", None, "internal: run as an in-process worker of --onednn=ab with this JSON spec")


def main(argv):
    del argv  # everything is a flag
    args = FLAGS
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # the export's INFO lines off, as in the project's commands
    if args.worker:
        return worker_main(json.loads(args.worker))
    if args.onednn in ("0", "1"):
        os.environ[ONEDNN] = args.onednn  # before TensorFlow starts, here and in the servers
    setup = prepare(args)
    if args.onednn == "ab":
        out = Path(args.out) if FLAGS["out"].present else ROOT / "bench" / "results" / "serving_latency_onednn_ab.json"
        report = run_ab(args, setup)
        return save_report(report, ab_markdown(report), out, print)
    report = run_one_value(args, setup)
    out = Path(args.out)
    if args.weights != "float32" and not FLAGS["out"].present:
        out = out.with_name(f"{out.stem}_{args.weights}.json")
    save_report(report, markdown(report), out, print)


if __name__ == "__main__":
    define_flags()
    app.run(main)
