"""The shared harness of the benchmarks: clocks, others' CPU share, worker processes, commands, peak matmul, reports.

* ``Clock`` / ``timed``: wall seconds, this process's CPU seconds and the share of the machine's CPU time
  other processes used meanwhile (the machine may be shared; 0: we had it to ourselves). ``measured_run``: a command
  run to its end, with its wall and CPU seconds, peak resident memory and others' share.
* ``Worker``: one stack in its own process (``python -m <module> --worker=<spec as JSON>``), driven line
  by line (``<tag><KIND> <JSON>``), so that stacks take turns step by step (a load change hits all alike);
  ``emit`` is the worker's side; ``worker_result``: a worker that answers once. ``wait_until_quiet``: waits for other
  processes to go quiet.
* ``run_command`` / ``BackgroundCommand``: a command run from the repository root (the experiments' runs), to its end
  or beside others; ``shown_command``: it as a user types it there, the paths relative.
* ``measure_peak`` / ``measure_peaks``: the best square-matmul FLOP/s through TF and torch, the MFU's peak.
* ``machine_info`` (CPU model, features, cores, versions, load), ``header`` (its one line), ``cpu_slug`` (its
  name in a file name), ``new_report`` (a report's command, date and machine), ``save_report`` (the JSON and the
  markdown beside it).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"  # the shared data folder: books, GLUE, Story Cloze, GPT-1's BPE
TASK_FOLDERS = {"sst2": "glue/SST-2", "cola": "glue/CoLA", "mrpc": "glue/MRPC", "stsb": "glue/STS-B", "rte": "glue/RTE",
                "story_cloze": "story_cloze"}  # each task's official files under the shared data folder
PRECISIONS = ("float32", "bfloat16")
TAG = "@@bench "  # prefix of the protocol lines a worker prints on stdout
ISA = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")


# ----------------------------------------------------------------------------- clocks


def cpu_seconds():
    """CPU seconds used so far by this process (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def busy_seconds():
    """Machine-wide busy CPU seconds so far (all cores, from /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait


class Clock:
    """Started when made; ``read()``: wall seconds, own CPU seconds and the share of the machine's CPU
    time that other processes used meanwhile (0: we had the machine to ourselves)."""

    def __init__(self):
        self.start = (busy_seconds(), cpu_seconds(), time.perf_counter())

    def read(self) -> dict:
        busy, cpu, start = self.start
        wall, own = time.perf_counter() - start, cpu_seconds() - cpu
        others = max(0.0, busy_seconds() - busy - own) / ((os.cpu_count() or 1) * wall)
        return {"s": wall, "cpu_s": own, "others_cpu_share": min(others, 1.0)}


def timed(fn):
    """Runs ``fn()``; returns its result and the ``Clock`` reading over it."""
    clock = Clock()
    result = fn()
    return result, clock.read()


def measured_run(argv, cwd, env=None) -> dict:
    """Runs ``argv`` to its end: wall seconds, its CPU seconds and peak resident memory (the process's own, and its
    children's it waited for: the kernel's ``wait4`` accounting), the share of the CPUs other processes used
    meanwhile, its exit status and the last 2,000 characters of its output."""
    busy, start = busy_seconds(), time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # waited for here: Popen must not wait again
    seconds, cpu, busy = time.perf_counter() - start, usage.ru_utime + usage.ru_stime, busy_seconds() - busy
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_mib": usage.ru_maxrss / 1024,
            "others_cpu_share": min(1.0, max(0.0, busy - cpu) / ((os.cpu_count() or 1) * seconds)),
            "returncode": proc.returncode, "output_tail": output[-2000:]}


def wait_until_quiet(quiet_share, timeout_s, window_s=0.5):
    """Waits (at most ``timeout_s``) until other processes use ≤ ``quiet_share`` of the CPUs over a window.

    Called between steps, when every worker of ours is idle, so all busy CPU time is someone else's.
    Returns the seconds waited.
    """
    start = time.time()
    while time.time() - start < timeout_s:
        busy = busy_seconds()
        time.sleep(window_s)
        if (busy_seconds() - busy) / ((os.cpu_count() or 1) * window_s) <= quiet_share:
            break
    return time.time() - start


# ----------------------------------------------------------------------------- worker processes


def emit(kind, payload, tag=TAG):
    """A worker's answer: one ``<tag><KIND> <JSON>`` line on stdout."""
    print(f"{tag}{kind} {json.dumps(payload)}", flush=True)


class Worker:
    """One stack in a subprocess, driven line by line (stderr goes to a temp file, shown on failure).

    The subprocess is ``python -m <module> --worker=<spec as JSON>``; it answers on stdout with
    lines ``<tag><KIND> <JSON payload>``. ``code_root``: a folder whose packages (e.g. an older
    ``gpt_tf``) come before this checkout's; the worker then runs from there. ``env``: extra variables.
    """

    def __init__(self, spec, module, tag=TAG, code_root=None, env=None):
        self.spec, self.tag = spec, tag
        self.stderr = tempfile.TemporaryFile(mode="w+")
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **(env or {})}
        if code_root:
            env["PYTHONPATH"] = os.pathsep.join([str(code_root), str(ROOT)])
        cmd = [sys.executable, "-m", module, f"--worker={json.dumps(spec)}"]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env,
            cwd=code_root or ROOT,
        )

    def read(self, kind):
        """The payload of the next ``kind`` line; raises with the worker's stderr tail if it died."""
        for line in self.proc.stdout:
            if line.startswith(self.tag):
                got, payload = line[len(self.tag) :].split(" ", 1)
                if got == kind:
                    return json.loads(payload)
        self.proc.wait()
        self.stderr.seek(0)
        tail = "\n".join(self.stderr.read().splitlines()[-12:])
        raise RuntimeError(f"worker {self.spec} exited with {self.proc.returncode} before {kind}:\n{tail}")

    def ask(self, command, kind):
        """Sends one ``command`` line; returns the payload of the ``kind`` line that answers it."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read(kind)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()
        self.stderr.close()


def worker_result(spec, module, kind="RESULT", **options):
    """The payload of the one ``kind`` line a ``Worker`` of ``spec`` answers (``options``: ``Worker``'s)."""
    worker = Worker(spec, module, **options)
    try:
        return worker.read(kind)
    finally:
        worker.close()


def apply_settings() -> str:
    """Puts the project's CPU settings (``--speed=auto``'s: ``gpt_tf/speed/resolve.py``) in this process's environment,
    as the variables that set them by hand, for the workers it starts next (call before they start); the line saying
    what runs."""
    from gpt_tf.speed import resolve

    speed = resolve.for_command("auto")
    if speed.measuring:  # not under GPT_TF_AUTOTUNE=0 (TensorFlow's defaults)
        picked = speed.choices
        os.environ.update({"GPT_TF_FUSED_KERNELS": str(int(picked.fused_kernels)),
                           "TF_NUM_INTRAOP_THREADS": str(picked.intra_op_threads),
                           "TF_NUM_INTEROP_THREADS": str(picked.inter_op_threads)})
        if picked.onednn is not None:
            os.environ["TF_ENABLE_ONEDNN_OPTS"] = str(int(picked.onednn))
    return resolve.line(speed)


def use_speed_choices(config, dtype: str) -> None:
    """In a worker about to build the project's model of ``config`` computing in ``dtype``: the speed choices
    ``python -m gpt_tf.train`` makes before it builds one (``gpt_tf/speed/resolve.py``: per shape, cached)."""
    from gpt_tf.speed import choices, resolve

    choices.set_current(resolve.autotune(config, dtype))


def git(*args) -> str:
    """``git *args`` in this checkout; its stdout, stripped."""
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def base_checkout(rev: str, prefix: str = "bench_ab_"):
    """A temporary detached `git worktree` of ``rev`` for A/B workers (``Worker``'s ``code_root``), removed
    afterwards. Yields ``(path, labels)``: the short hashes of ``rev`` and of this checkout (marked where
    it has uncommitted changes)."""
    labels = {"base": git("rev-parse", "--short", rev), "this": git("rev-parse", "--short", "HEAD")}
    if git("status", "--porcelain", "--untracked-files=no"):
        labels["this"] += " + uncommitted changes"
    tree = Path(tempfile.mkdtemp(prefix=prefix)) / "base"
    git("worktree", "add", "--detach", str(tree), labels["base"])
    try:
        yield tree, labels
    finally:
        git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(tree.parent, ignore_errors=True)


# ----------------------------------------------------------------------------- commands from the repository root


def child_env(root=ROOT) -> dict:
    """The environment of a child process running the code of checkout ``root``, TensorFlow's start-up lines off."""
    return dict(os.environ, PYTHONPATH=str(root), TF_CPP_MIN_LOG_LEVEL="2")


def run_command(cmd: list[str], root=ROOT) -> tuple[str, float]:
    """Runs ``cmd`` in checkout ``root``, on its code; its stdout and wall-clock seconds (raises if it fails)."""
    start = time.time()
    proc = subprocess.run(cmd, cwd=root, env=child_env(root), capture_output=True, text=True)
    seconds = time.time() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout, seconds


class BackgroundCommand:
    """Starts ``cmd`` from the repository root beside others, stderr to ``log``, stdout beside it;
    ``wait`` returns what ``run_command`` would."""

    def __init__(self, cmd: list[str], log):
        self.cmd, self.log, self.out = cmd, Path(log), Path(log).with_suffix(".stdout")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.start = time.time()
        with open(self.out, "w") as out, open(self.log, "w") as err:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=out, stderr=err, text=True)

    def finished(self) -> bool:
        return self.proc.poll() is not None

    def stop(self) -> None:
        """SIGTERM (a trainer saves a checkpoint and exits), then waits for it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()

    def wait(self) -> tuple[str, float]:
        returncode = self.proc.wait()
        seconds = time.time() - self.start
        if returncode != 0:
            tail = self.log.read_text()[-3000:]
            raise RuntimeError(f"{shlex.join(self.cmd)} failed ({returncode}); its log {self.log} ends:\n{tail}")
        return self.out.read_text(), seconds


def relative(arg: str) -> str:
    """``arg`` with this checkout's absolute path taken out (a path under the repository root, or a flag's value that
    is one, as a user types it from the root): what the ledgers and docs record works on any machine."""
    return arg.replace(f"{ROOT}{os.sep}", "")


def shown_command(cmd: list[str]) -> str:
    """The command as a user types it from the repository root (``python -m ...``), paths relative to the root."""
    return shlex.join(relative(a) for a in cmd[1:]).replace("-m ", "python -m ", 1)


# ----------------------------------------------------------------------------- peak matmul


def measure_peak(lib, sizes, reps, threads, quiet_share, precisions=PRECISIONS):
    """Matmul FLOP/s through ``lib`` (tf or torch) per precision and per square size: the best time over
    the repetitions during which other processes left the machine quiet (all of them if none was)."""
    results = {}
    if lib == "tf" and threads:  # before TensorFlow's first op (a fresh worker): its pools sized as torch's
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    for precision in precisions:
        for size in sizes:
            run = _tf_matmul(size, precision) if lib == "tf" else _torch_matmul(size, precision, threads)
            run()
            stats = [timed(run)[1] for _ in range(reps)]
            quiet = [s for s in stats if s["others_cpu_share"] <= quiet_share] or stats
            results[f"{precision}@{size}"] = 2.0 * size**3 / min(s["s"] for s in quiet)
    return results


def measure_peaks(module, sizes, threads, quiet_share, log, precisions=PRECISIONS):
    """Best matmul FLOP/s per precision over TF, torch and ``sizes``, each library in a ``module`` worker
    (its ``--worker`` runs ``measure_peak`` for a ``{"kind": "peak"}`` spec). Only ``precisions`` are timed (torch's
    bf16 matmul without bf16 instructions is emulated: minutes at 2048² on an AVX2-only CPU)."""
    per_lib, best = {}, {}
    for lib in ("tf", "torch"):
        spec = {"kind": "peak", "lib": lib, "sizes": sizes, "reps": 6, "threads": threads, "quiet_share": quiet_share,
                "precisions": list(precisions)}
        per_lib[lib] = worker_result(spec, module)
        log(f"  {lib} matmul GFLOP/s: " + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in per_lib[lib].items()))
        for key, flops in per_lib[lib].items():
            precision = key.split("@")[0]
            best[precision] = max(best.get(precision, 0.0), flops)
    return best, per_lib


def _tf_matmul(size, precision):
    """A callable running one ``size``² TF matmul (CPU eager results are ready when it returns)."""
    import tensorflow as tf

    a = tf.cast(tf.random.normal((size, size)), precision)
    b = tf.transpose(a)
    matmul = tf.function(tf.matmul)
    return lambda: matmul(a, b).shape


def _torch_matmul(size, precision, threads):
    """A callable running one ``size``² torch matmul on ``threads`` threads."""
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(size, size).to(getattr(torch, precision))
    b = a.t().contiguous()
    return lambda: torch.matmul(a, b).shape


# ----------------------------------------------------------------------------- reports


def machine_info():
    """CPU model and features, core count, memory, library versions and load of this machine."""
    from importlib import metadata

    from gpt_tf.speed.autotune import cpu_info

    cpu = cpu_info()
    versions = {}
    for package in ("tensorflow", "keras", "keras-hub", "torch", "transformers", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpu": cpu["model"],
        "cores": os.cpu_count(),
        "isa": [f for f in ISA if f in cpu["flags"]],
        "cpu_flags": " ".join(cpu["flags"]),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "versions": versions,
        "loadavg_at_start": os.getloadavg(),
    }


def new_report(module: str, timespec: str = "seconds") -> dict:
    """What a report starts with: its command (``python -m <module>`` and this process's arguments), date, machine."""
    return {"command": " ".join([f"python -m {module}", *sys.argv[1:]]), "machine": machine_info(),
            "date": datetime.datetime.now().astimezone().isoformat(timespec=timespec)}


def cpu_slug(info: dict) -> str:
    """``amd_epyc_avx2``: the CPU model and its widest vector / bf16 feature, for a report's file name."""
    isa = next((f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in info["isa"]), "")
    return "_".join(x for x in (re.sub(r"[^a-z0-9]+", "_", info["cpu"].lower()).strip("_"), isa) if x)


def header(info: dict) -> str:
    """``AMD EPYC, 2 cores (avx2 fma; no AVX-512, no bf16), load 1.2 3.4 5.6; tensorflow 2.21.0, ...``."""
    missing = [name for name, flag in (("AVX-512", "avx512f"), ("bf16", "avx512_bf16")) if flag not in info["isa"]]
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    load = " ".join(f"{x:.1f}" for x in info["loadavg_at_start"])
    return (f"{info['cpu']}, {info['cores']} cores ({' '.join(info['isa']) or 'no AVX2'}"
            f"{'; no ' + ', no '.join(missing) if missing else ''}), load average at start {load}; {versions}")


def save_report(report: dict, text: str, out: Path, log) -> None:
    """Prints the markdown, writes the report as ``out`` (JSON) and ``out`` .md, with the load at the end."""
    report.setdefault("machine", {})["loadavg_at_end"] = os.getloadavg()
    print("\n" + text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(text)
    log(f"wrote {out} and {out.with_suffix('.md')}")
