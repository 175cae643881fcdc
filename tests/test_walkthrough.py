"""README command 1 and the README's walk-through, run as written at test scale: a README command that breaks
fails here.

The walk-through is the README's ```bash blocks that follow a ``<!-- walkthrough -->`` line (each command
runs in turn and must succeed) or a ``<!-- walkthrough: serve -->`` line (servers: each is started, waited
for until the ports it names answer, and stopped once the blocks after it have run). They run in a
temporary folder laid out like the repository (links to its code, configs and .venv; fresh data/, runs/,
exported/) beside ../shared/data, in an environment like `source .venv/bin/activate` gives, with GLUE_DIR
set to ../shared/data/glue as the README asks a user to set it to their GLUE folder, after
`bash scripts/demo.sh` (README command 1). Test scale: the flags in DEMO_SCALE and SCALE are appended
to the commands (later flags win: 40 task examples, one epoch of batches of 8), and the ports the README
names are swapped for free ones.

Besides each command's success, it checks what the walk-through promises: the submission file, the same
answer over gRPC and REST, the served models' status, TensorBoard's runs, and a quiet console (no
TensorFlow start-up lines, no carriage-return progress bars in these non-terminal outputs).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINKED = ("bench", "configs", "gpt_tf", "pipelines", "serving", "scripts", "tools", "pyproject.toml",
          "requirements.txt", "requirements-dev.txt")
DEMO_SCALE = ["--model=test", "--train_steps=4", "--warmup_steps=1", "--batch_size=4", "--log_every=2",
              "--eval_batches=2", "--sample_length=8"]
SCALE = {"pipelines.finetune_data": ["--max_examples=40"], "gpt_tf.train": ["--epochs=1", "--batch_size=8"]}
PORTS = ("8500", "8501", "6006")
TF_START_UP = ("cuInit", "oneDNN custom operations", "rebuild TensorFlow", "Could not find cuda drivers",
               "absl::InitializeLog")
ABSL_INFO = re.compile(r"^I\d{4} \d\d:\d\d:\d\d", re.M)  # an absl / TensorFlow INFO line
BLOCK = re.compile(r"^<!-- walkthrough(?P<serve>: serve)? -->\n```bash\n(?P<body>.*?)^```", re.M | re.S)


def walkthrough_blocks(readme: str) -> list[tuple[bool, list[str]]]:
    """``[(serve, [command, ...])]`` of the marked blocks: continuation lines joined, comment lines dropped."""
    blocks = []
    for match in BLOCK.finditer(readme):
        lines = match.group("body").replace("\\\n", " ").splitlines()
        commands = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        blocks.append((bool(match.group("serve")), [c for c in commands if c != "source .venv/bin/activate"]))
    return blocks


def at_test_scale(command: str, ports: dict) -> str:
    """The command with the README's ports swapped and, for a ``python -m`` module in SCALE, its flags appended."""
    command = re.sub(r"\b(" + "|".join(PORTS) + r")\b", lambda m: ports[m.group(1)], command)
    words = shlex.split(command, comments=True)  # drops a trailing `# comment`, which would swallow the flags
    if words[:2] == ["python", "-m"]:
        words += SCALE.get(words[2], [])
    return " ".join(_quoted(word) for word in words)


def _quoted(word: str) -> str:
    """``shlex.quote``, but a word with a plain ``$NAME`` / ``${NAME:-default}`` in double quotes: the shell expands it."""
    if "$" in word and re.fullmatch(r'[^"\\`!]*', word):
        return f'"{word}"'
    return shlex.quote(word)


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def answers(port: str) -> bool:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def project(shared_data, tmp_path_factory):
    """A folder laid out like the repository, with ../shared/data beside it."""
    if not (Path(sys.prefix) / "bin" / "activate").is_file():
        pytest.fail(f"the walk-through needs the tests to run in a virtual environment ({sys.prefix} is not one)")
    top = tmp_path_factory.mktemp("walkthrough")
    (top / "shared").mkdir()
    (top / "shared" / "data").symlink_to(shared_data)
    project = top / "gpt-tf"
    project.mkdir()
    for name in LINKED:
        (project / name).symlink_to(ROOT / name)
    (project / ".venv").symlink_to(sys.prefix)
    return project


class Shell:
    """Runs commands as a user whose shell has sourced .venv/bin/activate; keeps every output."""

    def __init__(self, project: Path):
        self.project, self.outputs, self.servers, self.exports = project, [], [], []
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "GPT_TF_VERBOSE", "VIRTUAL_ENV")}
        self.env["GLUE_DIR"] = str(project.parent / "shared" / "data" / "glue")  # the user's GLUE folder (README)

    def _argv(self, command: str) -> list[str]:  # the README's `export NAME=...` lines hold for the commands after them
        return ["bash", "-c", " && ".join(["source .venv/bin/activate", *self.exports, command])]

    def run(self, command: str, timeout: int = 600) -> subprocess.CompletedProcess:
        proc = subprocess.run(self._argv(command), cwd=self.project, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        self.outputs.append((command, proc.stdout, proc.stderr))
        assert proc.returncode == 0, f"`{command}` failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    def serve(self, command: str, ports: list[str], timeout: float = 240) -> None:
        """Starts a server in the background and waits until each of ``ports`` accepts connections."""
        log = self.project / f"server{len(self.servers)}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(self._argv(f"exec {command}"), cwd=self.project, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, text=True)
        self.servers.append((command, proc, log))
        deadline = time.time() + timeout
        while not all(answers(p) for p in ports):
            assert proc.poll() is None, f"`{command}` exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            assert time.time() < deadline, f"`{command}` did not answer on {ports} in {timeout} s:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)

    def stop_servers(self) -> None:
        for command, proc, log in self.servers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            self.outputs.append((command, "", log.read_text()))


def test_readme_command_1_and_the_walkthrough_work_as_written(project):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    assert "bash scripts/demo.sh" in first, "README command 1 is no longer `bash scripts/demo.sh`"
    blocks = walkthrough_blocks(readme)
    assert blocks and any(serve for serve, _ in blocks), "the README has no marked walk-through"
    assert any(c.startswith("export GLUE_DIR=") for _, commands in blocks for c in commands), "GLUE_DIR is not set"
    ports = {p: free_port() for p in PORTS}
    shell = Shell(project)
    try:
        demo = shell.run(f"SKIP_SETUP=1 bash scripts/demo.sh {shlex.join(DEMO_SCALE)}")
        for serve, commands in blocks:
            for command in commands:
                command = at_test_scale(command, ports)
                if command.startswith("export "):
                    shell.exports.append(command)
                elif serve:
                    shell.serve(command, [p for p in ports.values() if re.search(rf"\b{p}\b", command)])
                else:
                    shell.run(command)
        tensorboard_runs = _tensorboard_runs(shell, ports["6006"], TENSORBOARD_RUNS)
    finally:
        shell.stop_servers()

    # Command 1 ends with a summary and loads (never "resumes") the model it evaluates and samples.
    assert "Held-out perplexity" in demo.stdout and "The run: runs/shakespeare_tiny" in demo.stdout
    assert demo.stderr.count("loaded runs/shakespeare_tiny/checkpoints/ckpt-4 (step 4)") == 2, demo.stderr
    assert "resumed from" not in demo.stderr
    # Fine-tuning started from the shipped books preset, named as --init_checkpoint (no run folder made of it), and
    # the language model was exported from it.
    tuned = [err for command, _, err in shell.outputs if "--init_checkpoint=gpt1_tiny_books_en" in command]
    assert len(tuned) == 1 and "initialised from gpt1_tiny_books_en: embeddings + 4 of 4 blocks" in tuned[0], tuned
    assert not (project / "runs" / "books_tiny").exists()
    assert (project / "exported" / "lm" / "1" / "saved_model.pb").is_file()
    # The submission: GLUE's layout (SST-2's labels as 0 / 1), one row per test example (40 at this scale).
    rows = (project / "runs" / "finetune_sst2_tiny" / "SST-2.test.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 41 and {r.split("\t")[1] for r in rows[1:]} <= {"0", "1"}
    # The same question over gRPC and REST gets the same answer, printed the same way.
    outputs = {command: stdout for command, stdout, _ in shell.outputs}
    clients = [out for command, out in outputs.items() if "serving.client" in command and "sst2" in command]
    assert len(clients) >= 2 and len(set(clients)) == 1, clients
    assert json.loads(clients[0].splitlines()[0])["label"] in ("negative", "positive")
    asked = [json.loads(out) for command, out in outputs.items() if command.startswith("curl") and ":predict" in command]
    assert asked and all("predictions" in a for a in asked), asked
    # serving/models.config found both exported models (its base paths are relative to the file).
    server_log = next(err for command, _, err in shell.outputs if "serving.server" in command)
    assert "models: lm, sst2" in server_log and "WARNING" not in server_log, server_log
    assert TENSORBOARD_RUNS <= set(tensorboard_runs), tensorboard_runs
    # A quiet console: no TensorFlow start-up lines, no progress bars redrawn with \r (TensorBoard's own
    # start-up is TensorBoard's).
    for command, stdout, stderr in shell.outputs:
        if command.startswith("tensorboard"):
            continue
        for line in TF_START_UP:
            assert line not in stdout + stderr, f"`{command}` printed TensorFlow's {line!r}:\n{stderr[-3000:]}"
        assert not ABSL_INFO.search(stdout + stderr), f"`{command}` printed INFO log lines:\n{stderr[-3000:]}"
        assert "\r" not in stdout + stderr, f"`{command}` drew a progress bar into a non-terminal output"


TENSORBOARD_RUNS = {"shakespeare_tiny/tb", "finetune_sst2_tiny/tb"}  # Command 1's pre-training, the fine-tuning


def _tensorboard_runs(shell: Shell, port: str, expected: set) -> list:
    """The runs TensorBoard found (it may list them a moment after it starts answering): once it lists
    ``expected``, or after a minute."""
    deadline, runs = time.time() + 60, []
    while time.time() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=10) as response:
            runs = json.loads(response.read())
        if expected <= set(runs):
            break
        time.sleep(1)
    return runs


# The README's "Python API" block (```python after `<!-- python-api -->`), at test scale: these edits only
# (each must still match the README, so the block and the test cannot drift apart).
PYTHON_BLOCK = re.compile(r"^<!-- python-api -->\n```python\n(?P<body>.*?)^```", re.M | re.S)
PYTHON_SCALE = (('sst2("train")', 'sst2("train", limit=48)'), ('sst2("dev")', 'sst2("dev", limit=16)'),
                ("max_length=24", "max_length=12"))


def test_readme_python_api_block_runs_as_written(project):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = PYTHON_BLOCK.search(readme)
    assert match, "the README has no <!-- python-api --> block"
    block = match.group("body")
    assert len(block.strip().splitlines()) <= 32, "the Python API block should stay about 30 lines"
    for old, new in PYTHON_SCALE:
        assert old in block, f"{old!r} is no longer in the README's Python API block: update PYTHON_SCALE"
        block = block.replace(old, new)
    (project / "python_api.py").write_text(block, encoding="utf-8")
    proc = Shell(project).run("python python_api.py", timeout=900)
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith("{'accuracy'") for line in lines), proc.stdout[-2000:]
    assert any(line.startswith("the man walked into the room and") for line in lines), proc.stdout[-2000:]
    assert (project / "presets" / "sst2_tiny" / "task.json").is_file()
