"""``python -m bench.serving_latency --onednn=ab`` (issue #31 item 5): oneDNN's rewrites off and on measured in
one run, interleaved, each value in its own processes. At the smallest size (the `test` model size, two requests,
one round, concurrency 1) it checks what the comparison rests on, never a timing: every process saw its own
value of ``TF_ENABLE_ONEDNN_OPTS`` (the in-process workers' ``IsMklEnabled()`` too), the values alternate slot
by slot, the report has every row for both, and no server or worker outlives the run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.small_runs import run_cli

CONFIGS = ("in-process", "grpc-batched", "grpc-unbatched")
BATCH = "in-process-batch"


def test_schedule_alternates_the_values_slot_by_slot_and_swaps_the_first_each_round():
    from bench.serving_latency import schedule

    order = schedule(3, [1, 8])
    slots = [(c, n) for n in (1, 8) for c in CONFIGS + ((BATCH,) if n == 8 else ())]
    assert len(order) == 3 * len(slots) * 2
    for i in range(0, len(order), 2):
        (r1, name1, c1, v1), (r2, name2, c2, v2) = order[i], order[i + 1]
        assert (r1, name1, c1) == (r2, name2, c2) and {v1, v2} == {"0", "1"}
        assert v1 == ("0" if r1 % 2 == 0 else "1")  # off first in rounds 1 and 3, on first in round 2
    for rnd in range(3):
        assert [(name, c) for r, name, c, _ in order[::2] if r == rnd] == slots


def test_stop_server_kills_a_server_that_ignores_sigterm():
    """A hung server must not outlive the benchmark (nor keep the next server's stop from running)."""
    import subprocess
    import sys
    import tempfile

    from bench._servers import stop_server

    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"],
                            stdout=subprocess.PIPE, text=True)
    proc.stderr_file = tempfile.TemporaryFile(mode="w+")
    assert proc.stdout.readline().strip() == "ready"
    stop_server(proc, timeout=0.5)
    assert proc.returncode == -9 and proc.stderr_file.closed
    proc.stdout.close()


def _alive(pid: int) -> bool:
    """Whether ``pid`` is still one of the run's processes (a reused pid running something else is not)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
    except OSError:
        return False
    return "serving.server" in cmdline or "bench.serving_latency" in cmdline


def test_ab_run_measures_both_values_in_their_own_processes(tmp_path):
    from gpt_tf.speed.autotune import serving_default

    out = tmp_path / "ab.json"
    run_cli("bench.serving_latency", "--onednn=ab", "--preset=test", "--requests=2", "--rounds=1",
            "--concurrency=1", "--warmup=1", "--tokens=8,24", f"--out={out}", timeout=900)
    report = json.loads(out.read_text())

    seen = report["processes"]
    assert set(seen) == {f"{name}/{value}" for name in CONFIGS for value in ("off", "on")}
    for key, process in seen.items():
        on = key.endswith("/on")
        assert process["env"] == ("1" if on else "0"), (key, process)
        if key.startswith("in-process/"):
            assert process["mkl_enabled"] is on, (key, process)  # the variable acted at TensorFlow's start
    assert len({process["pid"] for process in seen.values()}) == 6  # six processes, one per setting and kind
    assert not [key for key, process in seen.items() if _alive(process["pid"])]  # all stopped with the run

    measured = [(m["round"], m["configuration"], m["concurrency"], m["onednn"]) for m in report["measured"]]
    assert measured == [(1, name, 1, value) for name in CONFIGS + (BATCH,) for value in ("off", "on")]

    assert set(report["results"]) == {f"{name}@1" for name in CONFIGS + (BATCH,)}
    for key, row in report["results"].items():
        for value in ("off", "on"):
            assert row[value]["requests"] == 2 and row[value]["p50_ms"] > 0 and row[value]["throughput_rps"] > 0
            assert row[value]["others_cpu"] >= 0  # a share of the CPU (from /proc ticks: may pass 1)
        assert abs(row["on_off_p50"] - row["on"]["p50_ms"] / row["off"]["p50_ms"]) < 1e-9

    verdict = report["verdict"]
    assert verdict["served_rows"] == 2 and 0 <= verdict["on_faster_rows"] <= 2
    assert verdict["serving_default"] == {"0": "off", "1": "on"}[serving_default()["TF_ENABLE_ONEDNN_OPTS"]]
    assert verdict["faster"] in ("off", "on", None)
    assert verdict["agrees"] == (verdict["faster"] == verdict["serving_default"] if verdict["faster"] else None)
    table = out.with_suffix(".md").read_text()
    assert verdict["text"] in table and table.count("| grpc-") == 2 and "| in-process |" in table
