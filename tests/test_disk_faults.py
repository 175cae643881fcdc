"""The machine's own faults under the commands that write: a full disk (checkpoints, TFRecord shards of both
builders, an export, a submission, the run's small files), a run folder made read-only or removed mid-run.

Each ends with one line naming the path (and, for a full disk, the free space) and a non-zero status, leaves
the previous good output as it was and no half-written file where a reader would take it for a whole one;
the same command, once space is freed, resumes (training: bit for bit from the last good checkpoint) or
finishes the build. The full disk is a real one, a small tmpfs, and the read-only folder a read-only bind
mount (``tests/small_runs.py``): both need root or CAP_SYS_ADMIN and skip, saying so, without it. The
writes that Python makes are also failed at chosen bytes by a wrapper around ``open`` (SQLite's way of
testing its I/O errors), which needs nothing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from gpt_tf.runs import files as run_files
from gpt_tf.write_errors import WriteError, as_write_error, writing
from tests.small_runs import (TRAIN_FLAGS, build_data, finish, max_abs_diff, model_weights, read_only, run_cli,
                              small_disk, start)

# Checkpoints every 10 steps: a fault made just after one lands takes effect before the next save.
FLAGS = [f for f in TRAIN_FLAGS if not f.startswith("--checkpoint_every")] + ["--checkpoint_every=10",
                                                                             "--deterministic"]
ONE_LINE = re.compile(r"^gpt_tf\.train: (.*)$")


def last_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    return stderr.strip().splitlines()[-1]


def newest_listed(run_dir: Path) -> int:
    """The step of the newest checkpoint a run's state file lists (0: none yet)."""
    state = run_dir / "checkpoints" / "checkpoint"
    try:
        return max((int(s) for s in re.findall(r'"ckpt-(\d+)"', state.read_text())), default=0)
    except OSError:
        return 0


def fill(disk: Path, leave: int = 256 << 10) -> Path:
    """Takes all of ``disk``'s free space but ``leave`` bytes (a file to delete to free it)."""
    filler = disk / "filler"
    with open(filler, "ab") as f:
        f.write(b"\0" * max(0, shutil.disk_usage(disk).free - leave))
    return filler


def files(folder: Path, skip=("tb",)) -> dict:
    """{relative path: bytes} of every file under ``folder`` but those under ``skip`` folders and checkpoint temps."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.relative_to(folder).parts[0] not in skip and "_temp" not in str(p)}


# ---------------------------------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory):
    return build_data(shared_data, tmp_path_factory.mktemp("fault_data"))


@pytest.fixture(scope="module")
def faulted(data, tmp_path_factory):
    """Four runs at once: one uninterrupted (30 steps); one whose disk is filled once its first checkpoint (step
    10) is listed; one whose folder is made read-only then, and one whose folder is removed then (400 steps: the
    fault stops them at their next save)."""
    root = tmp_path_factory.mktemp("faulted")
    with contextlib.ExitStack() as stack:
        disk = stack.enter_context(small_disk(root / "disk", "64m"))
        runs = {"straight": root / "straight", "full": disk / "run", "read_only": root / "ro", "removed": root / "gone"}
        steps = {"straight": 30, "full": 30, "read_only": 400, "removed": 400}
        flags = {name: [*FLAGS, f"--data_dir={data}", f"--run_dir={path}", f"--train_steps={steps[name]}"]
                 for name, path in runs.items()}
        procs = {name: start(flags[name]) for name in runs}
        seen, waiting, deadline = {}, ["full", "read_only", "removed"], time.monotonic() + 240
        while waiting:  # each fault as soon as its run lists a checkpoint (runs start seconds apart under load)
            for name in [n for n in waiting if newest_listed(runs[n])]:
                seen[f"{name}_step"] = newest_listed(runs[name])
                if name == "full":
                    seen["filler"] = fill(disk)
                elif name == "read_only":
                    stack.enter_context(read_only(runs[name]))
                    seen["before"] = files(runs[name])
                else:
                    shutil.rmtree(runs[name])
                waiting.remove(name)
            assert all(procs[n].poll() is None for n in waiting) and time.monotonic() < deadline, waiting
            time.sleep(0.02)
        results = dict(zip(procs, finish(list(procs.values()))))
        yield {"runs": runs, "flags": flags, "results": results, "disk": disk, **seen}


def test_a_full_disk_stops_training_in_one_line_and_the_same_command_resumes_bit_for_bit(faulted):
    run, (code, _, err) = faulted["runs"]["full"], faulted["results"]["full"]
    assert code == 1, err[-3000:]
    line = last_line(err)
    run_, disk, step = re.escape(str(run)), re.escape(str(faulted["disk"])), faulted["full_step"]
    match = re.fullmatch(rf"gpt_tf\.train: no space left on device writing {run_}/checkpoints/ckpt-(\d+) "
                         rf"\(free: (\d+\.\d) MB on {disk}\); the run is intact up to its checkpoint at "
                         rf"step {step} \({run_}/checkpoints/ckpt-{step}\): free some space and run the same "
                         r"command to resume", line)
    assert match, line
    assert float(match.group(2)) < 1.0
    # Nothing of the failed checkpoint is left, and the state file still names the last good one as the newest.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "checkpoint", f"ckpt-{step}.data-00000-of-00001", f"ckpt-{step}.index"]
    assert f'model_checkpoint_path: "ckpt-{step}"' in (run / "checkpoints" / "checkpoint").read_text()
    straight_code = faulted["results"]["straight"][0]
    assert straight_code == 0, faulted["results"]["straight"][2][-3000:]

    faulted["filler"].unlink(missing_ok=True)  # space freed
    proc = run_cli("gpt_tf.train", *faulted["flags"]["full"])
    assert f"resumed from {run}/checkpoints/ckpt-{step} at step {step}" in proc.stderr
    assert max_abs_diff(model_weights(faulted["runs"]["straight"], 30), model_weights(run, 30)) == 0.0


def test_a_run_folder_made_read_only_stops_training_in_one_line_and_nothing_in_it_changes(faulted):
    run, (code, _, err) = faulted["runs"]["read_only"], faulted["results"]["read_only"]
    assert code == 1, err[-3000:]
    line, run_, step = last_line(err), re.escape(str(run)), faulted["read_only_step"]
    assert re.fullmatch(rf"gpt_tf\.train: read-only file system: cannot write {run_}/checkpoints/ckpt-\d+ \({run_} is "
                        rf"mounted read-only\); the run is intact up to its checkpoint at step {step} "
                        rf"\({run_}/checkpoints/ckpt-{step}\): make it writable and run the same command to resume",
                        line), line
    assert files(run) == faulted["before"]  # configs, the lock, the state file and every checkpoint, byte for byte


def test_a_run_folder_removed_mid_run_stops_training_in_one_line_and_is_not_made_again(faulted):
    run, (code, _, err) = faulted["runs"]["removed"], faulted["results"]["removed"]
    assert code == 1, err[-3000:]
    line = last_line(err)
    assert re.fullmatch(rf"gpt_tf\.train: the run folder {re.escape(str(run))} was removed or replaced while training: step \d+ was "
                        r"not saved, and nothing more is written; put the folder back to resume it, or run the "
                        r"command again to train anew", line), line
    assert not run.exists()  # before: TensorFlow made it again and training went on into an empty folder, exit 0


def test_a_run_folder_read_only_from_the_start_is_one_line_before_anything_runs(data, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with read_only(run):
        proc = run_cli("gpt_tf.train", *FLAGS, f"--data_dir={data}", f"--run_dir={run}", "--train_steps=2",
                       check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"read-only file system: cannot write {run}/.lock" in proc.stderr and "Traceback" not in proc.stderr
    assert list(run.iterdir()) == []


# ---------------------------------------------------------------------------------------------- the builders
def _refused_build_left_the_data_as_it_was(proc, disk, out, written: str, before: bytes):
    """A data build refused by a full disk: exit 1, one line naming the file (``written``, a pattern) and the free
    space, and the data folder as it was (its manifest and the files it names)."""
    from gpt_tf.data.records import data_file_problems

    assert proc.returncode == 1, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    disk_, out_ = re.escape(str(disk)), re.escape(str(out))
    assert re.fullmatch(rf"error: no space left on device writing {disk_}/\.{re.escape(out.name)}\.tmp-\d+/{written} "
                        rf"\(free: 0\.\d MB on {disk_}\); {out_} is as it was \(the partial build was removed\): "
                        r"free some space and run the same command", line), line
    assert (out / "manifest.json").read_bytes() == before and data_file_problems(out, json.loads(before)) == []


def test_pretraining_shards_on_a_full_disk(shared_data, tmp_path):
    """A rebuild that runs out of space: one line, the previous build intact (manifest and every shard's sha256),
    no temporary folder; with the space freed the same command finishes the build."""
    from gpt_tf.data.records import data_file_problems, read_manifest
    from tests.small_runs import books_folder

    from pipelines.pretrain_data import PretrainConfig, build_pretraining_data

    train, valid = books_folder(shared_data, tmp_path / "books")
    with small_disk(tmp_path / "disk", "2m") as disk:
        out = disk / "data"
        args = [f"--input_dir={train}", f"--valid_dir={valid}", f"--output_dir={out}", "--n_ctx=32",
                f"--tokenizer_dir={shared_data / 'gpt1_bpe'}", "--progress=false"]
        build_pretraining_data(PretrainConfig(input_dir=str(train), valid_dir=str(valid), output_dir=str(out),
                                              tokenizer_dir=str(shared_data / "gpt1_bpe"), n_ctx=32, shard_size=16,
                                              show_progress=False))
        before = (out / "manifest.json").read_bytes()
        filler = fill(disk, leave=64 << 10)
        proc = run_cli("pipelines.pretrain_data", *args, "--shard_size=8", "--overwrite", check=False)
        _refused_build_left_the_data_as_it_was(proc, disk, out, r"\S+\.tfrecord\.gz", before)
        assert sorted(p.name for p in disk.iterdir()) == ["data", "filler"]
        filler.unlink()
        run_cli("pipelines.pretrain_data", *args, "--shard_size=8", "--overwrite")
        manifest = read_manifest(out)
        assert manifest["config"]["shard_size"] == 8 and data_file_problems(out, manifest) == []


def test_fine_tuning_records_on_a_full_disk(shared_data, tmp_path):
    from pipelines.finetune_data import build_task_data
    from gpt_tf.data.records import data_file_problems, read_manifest

    bpe = shared_data / "gpt1_bpe"
    with small_disk(tmp_path / "disk", "1m") as disk:
        out = disk / "sst2"
        build_task_data("sst2", shared_data / "glue" / "SST-2", bpe, out, splits=["dev"], max_examples=50,
                        show_progress=False)
        before = (out / "manifest.json").read_bytes()
        filler = fill(disk, leave=16 << 10)
        args = ["--task=sst2", f"--data_dir={shared_data / 'glue' / 'SST-2'}", f"--tokenizer_dir={bpe}",
                f"--output_dir={out}", "--splits=dev", "--progress=false", "--overwrite"]
        proc = run_cli("pipelines.finetune_data", *args, check=False)
        _refused_build_left_the_data_as_it_was(proc, disk, out, r"dev\.tfrecord\.gz", before)
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "sst2"]
        filler.unlink()
        run_cli("pipelines.finetune_data", *args)
        manifest = read_manifest(out)
        assert manifest["counts"] == {"dev": 872} and data_file_problems(out, manifest) == []


# ---------------------------------------------------------------------------------------------- an export
def test_an_export_on_a_full_disk_adds_no_version(faulted, tmp_path):
    """A version that does not fit: one line, the versions already there untouched, no new version and no
    temporary folder; once space is freed the next version is written (in process, a small model)."""
    from serving.saved_model_io import save_version
    from tests.small_runs import save_length_model

    with small_disk(tmp_path / "disk", "8m") as disk:
        base = disk / "exported"
        save_length_model(base / "lm" / "1")
        first = files(base / "lm" / "1")
        filler = fill(disk, leave=1 << 20)
        proc = run_cli("serving.export", f"--run_dir={faulted['runs']['straight']}", f"--export_base={base}",
                       "--model_name=lm", check=False)
        assert proc.returncode == 1, proc.stderr[-3000:]
        line = proc.stderr.strip().splitlines()[-1]
        base_, disk_ = re.escape(str(base)), re.escape(str(disk))
        assert re.fullmatch(rf"serving\.export: no space left on device writing {base_}/lm/2 \(free: \d\.\d MB on "
                            rf"{disk_}\); no version was added, those already in {base_}/lm are untouched: fix "
                            r"the storage and run the same command", line), line
        assert sorted(p.name for p in (base / "lm").iterdir()) == ["1"] and files(base / "lm" / "1") == first
        filler.unlink()
        import tensorflow as tf

        assert save_version(tf.Module(), {}, str(base), "lm") == f"{base}/lm/2"


# ---------------------------------------------------------------------------------------------- Python's own writes
class FailingOpen:
    """``open`` whose files opened for writing raise ENOSPC once ``budget`` bytes are written (the point the disk
    fills), as SQLite's I/O-error tests fail its writes at chosen points."""

    def __init__(self, budget: int):
        self.budget = budget

    def __call__(self, path, mode="r", *args, **kwargs):
        handle = open(path, mode, *args, **kwargs)  # noqa: SIM115 -- returned wrapped
        return handle if not any(c in mode for c in "wax+") else _Failing(handle, self, str(path))


class _Failing:
    def __init__(self, handle, budget: FailingOpen, path: str):
        self.handle, self.budget, self.path = handle, budget, path

    def write(self, data):
        if len(data) > self.budget.budget:
            self.handle.write(data[:self.budget.budget])
            self.budget.budget = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
        self.budget.budget -= len(data)
        return self.handle.write(data)

    def __getattr__(self, name):  # flush, fileno, close, ...
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()
        return False


@pytest.mark.parametrize("budget", [0, 1, 40, 200])
def test_atomic_files_on_a_full_disk_keep_the_old_file_whole(tmp_path, monkeypatch, budget):
    """``write_json_atomic`` / ``write_text_atomic`` (run configs, metrics.json, eval JSON, submissions, the
    zero-shot CSV) failed at byte ``budget``: the old file stays, whole, no temporary file is left, and the
    error is a ``WriteError`` naming the file."""
    path = tmp_path / "metrics.json"
    run_files.write_json_atomic(str(path), {"old": True})
    old = path.read_bytes()
    monkeypatch.setattr(run_files, "open", FailingOpen(budget), raising=False)
    with pytest.raises(WriteError) as caught:
        run_files.write_json_atomic(str(path), {"new": "x" * 300})
    assert str(caught.value).startswith(f"no space left on device writing {path} (free: ")
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["metrics.json"]


def test_a_submission_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """``write_submission`` writes the file in one rename: a full disk leaves the previous submission as it was."""
    from types import SimpleNamespace

    import numpy as np

    from gpt_tf.tasks import get_task
    from gpt_tf.runs import submissions

    task = get_task("sst2")
    tuner = SimpleNamespace(task=task, config=SimpleNamespace(data_dir="d"),
                            predict=lambda split: ({"logits": np.array([[0.0, 1.0]] * 3)}, None))
    monkeypatch.setattr(submissions, "task_predictions", lambda task, outs: np.array([1, 0, 1]))
    monkeypatch.setattr("gpt_tf.data.transforms.split_guids", lambda data_dir, split: ["test-0", "test-1", "test-2"])
    path = submissions.write_submission(tuner, "test", str(tmp_path))
    assert Path(path).read_text() == "index\tprediction\n0\t1\n1\t0\n2\t1\n"
    old = Path(path).read_bytes()
    monkeypatch.setattr(submissions, "task_predictions", lambda task, outs: np.array([0, 0, 0]))
    monkeypatch.setattr(run_files, "open", FailingOpen(10), raising=False)
    with pytest.raises(WriteError, match=f"no space left on device writing {re.escape(path)}"):
        submissions.write_submission(tuner, "test", str(tmp_path))
    assert Path(path).read_bytes() == old and os.listdir(tmp_path) == ["SST-2.test.tsv"]


def test_write_errors_are_told_apart_from_other_errors(tmp_path):
    """Only the storage's refusals become ``WriteError`` (TensorFlow's too, by the C library's text); a
    missing file or a refused permission only where the caller was writing."""
    class OpError(Exception):  # what TensorFlow's errors carry
        def __init__(self, message):
            super().__init__(message)
            self.message = message

    full = OpError("{{function_node __wrapped__SaveV2}} /data/run/checkpoints/ckpt-6_temp/part-0; No space left on "
                   "device [Op:SaveV2]")
    assert as_write_error(full).errno == errno.ENOSPC and as_write_error(full).path == "/data/run/checkpoints/ckpt-6_temp/part-0"
    assert as_write_error(OpError("x; Read-only file system")).errno == errno.EROFS
    assert as_write_error(OSError(errno.EDQUOT, "quota", "/q")).errno == errno.EDQUOT
    missing = OSError(errno.ENOENT, "No such file or directory", "/in")
    assert as_write_error(missing) is None and as_write_error(missing, "/out", strict=True).errno == errno.ENOENT
    assert as_write_error(ValueError("No space left on device")) is None  # not an OS error nor TensorFlow's
    with pytest.raises(WriteError, match=f"read-only file system: cannot write {tmp_path}/x"):
        with writing(tmp_path / "x"):
            raise OSError(errno.EROFS, "Read-only file system")
    with pytest.raises(KeyError):
        with writing(tmp_path / "x"):
            raise KeyError("not the storage")
