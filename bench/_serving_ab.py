"""``python -m bench.serving_latency --onednn=ab``: oneDNN's rewrites off and on in one run, interleaved.

``TF_ENABLE_ONEDNN_OPTS`` acts only when TensorFlow starts, so each value gets its own processes, started
with the variable set: an in-process worker (``harness.Worker``: the SavedModel loaded and called in it; it
reports the variable and ``IsMklEnabled()`` as it saw them) and two ``serving.server`` processes (batching
on and off; the variable read back from ``/proc/<pid>/environ``). The parent exports the model once, gives
all of them the same texts, and measures every slot (configuration x concurrency) with both values back to
back: off then on in odd rounds, on then off in even ones (``schedule``), the gRPC slots from the same
client with the same threads, so that a load change on a shared machine hits both values alike. Warm-up
requests (untimed) go to each process before its first timed slot. Each measurement records the share of
the CPU that processes other than ours (the parent, both workers, the four servers) used meanwhile.
The gRPC client is this process, with the serving default: it only builds requests, it runs no model.

The report (``bench/results/serving_latency_onednn_ab.{json,md}`` by default): per configuration and
concurrency, p50 / p99 ms and req/s off and on, the on / off ratio of p50, and the verdict: which value is
faster on served (gRPC) p50 in most rows here, against ``gpt_tf.autotune.serving_default()`` on this CPU.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from bench.harness import ROOT, CpuMeter, Worker, emit, header, machine_info, save_report
from bench.serving_latency import (BATCH, CONFIGS, grpc_caller, local_caller, run_load, server_port, spawn_server,
                                   stop_server, summary)

ONEDNN = "TF_ENABLE_ONEDNN_OPTS"
SETTINGS = ("0", "1")
LABEL = {"0": "off", "1": "on"}
SERVED = ("grpc-batched", "grpc-unbatched")
DEFAULT_OUT = ROOT / "bench" / "results" / "serving_latency_onednn_ab.json"


def schedule(rounds: int, concurrency: list) -> list:
    """``(round, configuration, concurrency, value)`` in the order measured: each slot with both values back
    to back, off first in rounds 1, 3, ..., on first in rounds 2, 4, ...; ``BATCH`` at the highest concurrency."""
    many = max(concurrency)
    order = []
    for rnd in range(rounds):
        values = SETTINGS if rnd % 2 == 0 else SETTINGS[::-1]
        for c in concurrency:
            for name in CONFIGS + ((BATCH,) if c == many else ()):
                order += [(rnd, name, c, value) for value in values]
    return order


def environ_of(pid: int) -> dict:
    """The environment process ``pid`` was started with (Linux ``/proc``)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode("utf-8", "replace").split("\0") if "=" in item)


# ----------------------------------------------------------------------------- the in-process worker


def worker_main(spec: dict) -> None:
    """Loads the SavedModel (TensorFlow started with this process's variable), reports what it saw, then runs
    one load per stdin line (``{"size", "requests", "threads"}``) and answers its latencies and wall time."""
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


# ----------------------------------------------------------------------------- the run


def run_ab(args, setup, out: Path) -> dict:
    """Starts both values' processes, measures ``schedule``'s slots, stops them all; writes the report to ``out``
    (JSON, and the markdown beside it) and returns it."""
    base, texts, concurrency = setup.base, setup.texts, setup.concurrency
    many = max(concurrency)
    (base / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    spec = {"model": str(base / "sst2" / "1"), "texts": str(base / "texts.json")}
    workers, servers = {}, {}
    try:
        for value in SETTINGS:  # all started at once: their start-ups overlap
            workers[value] = Worker(spec, "bench.serving_latency", env={ONEDNN: value})
            for name in SERVED:
                servers[name, value] = spawn_server(base, "sst2", name == "grpc-batched", 0, env={ONEDNN: value})
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
        pids = [os.getpid()] + [w.proc.pid for w in workers.values()] + [p.pid for p in servers.values()]
        samples, measured, warmed = {}, [], set()
        for rnd, name, c, value in schedule(args.rounds, concurrency):
            threads, requests = (1, args.requests // c) if name == BATCH else (c, args.requests)
            if name in SERVED:
                call = callers[name, c, value]

                def load(n, call=call, threads=threads):
                    return run_load(call, n, threads)
            else:
                def load(n, value=value, size=many if name == BATCH else 1, threads=threads):
                    got = workers[value].ask(json.dumps({"size": size, "requests": n, "threads": threads}), "RESULT")
                    return got["latencies"], got["wall"]
            if (name, c, value) not in warmed:
                load(max(args.warmup, threads))
                warmed.add((name, c, value))
            meter = CpuMeter(pids)
            meter.start()
            latencies, wall = load(requests)
            others = meter.stop()
            lat, total, shares = samples.get((name, c, value), ([], 0.0, []))
            samples[name, c, value] = (lat + latencies, total + wall, shares + [others])
            p50 = float(np.percentile(latencies, 50) * 1e3)
            measured.append({"round": rnd + 1, "configuration": name, "concurrency": c, "onednn": LABEL[value],
                             "p50_ms": p50, "others_cpu": others})
            print(f"round {rnd + 1} {name} x{c} oneDNN {LABEL[value]}: p50 {p50:.1f} ms, "
                  f"{len(latencies) / wall:.1f} calls/s, others' CPU {others:.0%}", flush=True)
    finally:
        for proc in servers.values():  # every server told at once, so that their graceful stops overlap
            if proc.poll() is None:
                proc.terminate()
        for worker in workers.values():
            worker.close()
        for proc in servers.values():
            stop_server(proc)
        shutil.rmtree(base, ignore_errors=True)
    report = build_report(args, setup, samples, measured, seen)
    save_report(report, markdown(report), out, print)
    return report


def build_report(args, setup, samples: dict, measured: list, seen: dict) -> dict:
    from gpt_tf.autotune import serving_default

    many = max(setup.concurrency)
    results = {}
    for (name, c, value), (lat, wall, shares) in samples.items():
        row = results.setdefault(f"{name}@{c}", {})
        row[LABEL[value]] = summary(lat, wall, float(np.mean(shares)))
        if name == BATCH:
            row[LABEL[value]]["throughput_rps"] *= many  # examples/s: each call carries `many` texts
    for row in results.values():
        row["on_off_p50"] = row["on"]["p50_ms"] / row["off"]["p50_ms"]
    served = [key for key in results if key.split("@")[0] in SERVED]
    on_faster = sum(results[key]["on"]["p50_ms"] < results[key]["off"]["p50_ms"] for key in served)
    faster = "on" if 2 * on_faster > len(served) else "off" if 2 * on_faster < len(served) else None
    default = LABEL[serving_default()[ONEDNN]]
    if faster:
        wins = on_faster if faster == "on" else len(served) - on_faster
        verdict = (f"Served (gRPC) p50: rewrites {faster} faster in {wins} of {len(served)} rows on this machine; "
                   f"`gpt_tf.autotune.serving_default()` here picks {default}: "
                   f"{'agrees' if faster == default else 'disagrees'}.")
    else:
        verdict = (f"Served (gRPC) p50: a tie, rewrites on faster in {on_faster} of {len(served)} rows; "
                   f"`gpt_tf.autotune.serving_default()` here picks {default}: neither agrees nor disagrees.")
    return {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "machine": machine_info(),
        "preset": args.preset, "params": setup.config.n_params, "tokens_min": setup.low, "tokens_max": setup.high,
        "rounds": args.rounds, "concurrency": setup.concurrency,
        "command": "python -m bench.serving_latency " + " ".join(sys.argv[1:]),
        "processes": seen, "measured": measured, "results": results,
        "verdict": {"served_rows": len(served), "on_faster_rows": on_faster, "faster": faster,
                    "serving_default": default, "agrees": faster == default if faster else None, "text": verdict},
    }


def markdown(report: dict) -> str:
    seen = report["processes"]
    mkl = ", ".join(f"{k}: {s['mkl_enabled']}" for k, s in seen.items() if "mkl_enabled" in s)
    lines = [f"Measured {report['date']} on {header(report['machine'])}; model `{report['preset']}` preset "
             f"({report['params'] / 1e6:.1f}M parameters, GPT-1 BPE), SST-2 head, random weights; "
             f"{report['tokens_min']}-{report['tokens_max']} text tokens per request (+ <s>, <e>); "
             f"{report['rounds']} rounds, oneDNN rewrites off and on interleaved slot by slot (off first in odd "
             f"rounds, on first in even ones), each value in its own processes (`IsMklEnabled()` in the "
             f"in-process workers: {mkl}).", "",
             f"Command: `{report['command']}`", "",
             "| configuration | concurrency | p50 ms off | p50 ms on | on / off p50 | p99 ms off | p99 ms on "
             "| req/s off | req/s on | others' CPU off / on |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    many = max(report["concurrency"])
    for c in report["concurrency"]:
        for name in CONFIGS + ((BATCH,) if c == many else ()):
            row = report["results"][f"{name}@{c}"]
            off, on = row["off"], row["on"]
            label = f"{name} (calls of {many} texts; examples/s)" if name == BATCH else name
            lines.append(f"| {label} | {1 if name == BATCH else c} | {off['p50_ms']:.1f} | {on['p50_ms']:.1f} | "
                         f"{row['on_off_p50']:.2f} | {off['p99_ms']:.1f} | {on['p99_ms']:.1f} | "
                         f"{off['throughput_rps']:.1f} | {on['throughput_rps']:.1f} | "
                         f"{off['others_cpu']:.0%} / {on['others_cpu']:.0%} |")
    lines += ["", report["verdict"]["text"]]
    return "\n".join(lines) + "\n"
