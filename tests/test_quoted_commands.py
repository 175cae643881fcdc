"""Every command quoted in README.md, docs/*.md, WORKSPACE.md, bench/README.md and tools/*/README.md still runs as far as its
command line goes: each ``python -m <module>`` of the project still exists and defines every ``--flag`` quoted
for it, each ``bash <script>`` and ``--flagfile=<file>`` is there, and so is every file of the project the docs
(and the shipped presets' model cards) name. A moved module or a renamed flag fails here; a figure whose script
is gone keeps no command beside it.

Cheap: one subprocess runs each quoted module's ``__main__`` block with ``absl.app.run`` (and argparse's
``parse_args``) replaced by a stop that records the flags defined by then, so nothing runs (the benchmarks take
minutes); a module without a command line (``gpt_tf.speed.kernels``) is only imported.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.small_runs import ENV

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "WORKSPACE.md", "bench/README.md",
        *sorted(p.relative_to(ROOT).as_posix() for p in (*(ROOT / "docs").glob("*.md"), *(ROOT / "tools").glob("*/README.md"))))
PROJECT = ("bench", "gpt_tf", "pipelines", "serving", "tools")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
# `python -m a.b --x=1 --y` up to the end of the command (a shell operator, a comment, a redirection)
PYTHON_M = re.compile(r"(?:^|[\s;&|(])(?:\S*/)?python3?\s+-m\s+([A-Za-z_][\w.]*)((?:[ \t]+(?![;&|#>])\S+)*)")
BASH = re.compile(r"(?:^|[\s;&|(])bash\s+((?:scripts|bench|tools)/[\w/.-]+\.sh)\b")
# a file of the project named anywhere in a doc (not a placeholder such as `configs/finetune_<task>_tiny.flags`)
PROJECT_FILE = re.compile(r"(?<![\w./-])((?:bench|configs|gpt_tf|pipelines|scripts|serving|tests|tools)/[\w/.-]*\w"
                          r"\.(?:py|sh|flags|json|jsonl|md|png|txt|config|h|cc))(?![\w{<])")

# Run in a fresh interpreter: {module: {"flags": [...], "bools": [...]} or {"error": "..."}} on stdout.
PROBE = r'''
import argparse, contextlib, importlib.util, io, json, runpy, sys
from absl import app, flags

class Stop(Exception):
    pass

def stop_absl(*args, **kwargs):
    raise Stop()

def stop_argparse(parser, *args, **kwargs):
    stop_argparse.options = [o for o in parser._option_string_actions if o.startswith("--")]
    raise Stop()

app.run = stop_absl
argparse.ArgumentParser.parse_args = stop_argparse
FLAGS = flags.FLAGS
builtin = set(FLAGS) | {"flagfile", "undefok", "help", "helpfull", "helpshort", "helpxml"}  # the parser's own
found = {}
for module in sys.argv[1:]:
    try:
        spec = importlib.util.find_spec(module)
        if spec is None:
            raise ImportError(f"no module named {module}")
        main = importlib.util.find_spec(module + ".__main__") if spec.submodule_search_locations else spec
        source = main.loader.get_source(main.name)
        before, stop_argparse.options = set(FLAGS), []
        if any(call in source for call in ("app.run(", "run_cli(", "ArgumentParser(", "\nrun()")):
            sys.argv = [module]
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    runpy.run_module(module, run_name="__main__")
            except Stop:
                pass
            else:
                raise RuntimeError("its command line was never parsed")
        else:
            importlib.import_module(main.name)
        defined = set(FLAGS) - before
        bools = [n for n in set(FLAGS) if FLAGS[n].boolean]
        found[module] = {"flags": sorted(defined | builtin | {o[2:] for o in stop_argparse.options}),
                         "bools": sorted(bools)}
        for name in defined:
            delattr(FLAGS, name)
    except BaseException as err:  # a module that fails to import is the finding
        found[module] = {"error": f"{type(err).__name__}: {err}"}
print("@@" + json.dumps(found))
'''


def quoted_commands(text: str) -> list[str]:
    """The command lines in fenced blocks (continuations joined) and in inline code spans elsewhere."""
    chunks = [m.group(1).replace("\\\n", " ") for m in FENCE.finditer(text)]
    chunks += [m.group(1) for m in INLINE.finditer(FENCE.sub("", text))]
    return [line for chunk in chunks for line in chunk.splitlines()]


def quoted_modules() -> dict[str, dict[str, set[str]]]:
    """``{module: {flag: {doc, ...}}}`` of the project's ``python -m`` commands quoted in the docs."""
    found: dict[str, dict[str, set[str]]] = {}
    for doc in DOCS:
        for line in quoted_commands((ROOT / doc).read_text(encoding="utf-8")):
            for match in PYTHON_M.finditer(line):
                module, args = match.group(1), match.group(2).split()
                if module.split(".")[0] not in PROJECT or module.endswith("."):
                    continue  # another tool's (pytest, pip), or a placeholder (`python -m bench.<script>`)
                flags = found.setdefault(module, {})
                flags.setdefault("", set()).add(doc)
                for arg in args:
                    if arg.startswith("--") and not arg.startswith("--<"):
                        flags.setdefault(arg[2:].split("=")[0], set()).add(doc)
    return found


def test_the_docs_quote_the_project_commands_this_test_reads():
    modules = quoted_modules()
    # The parser sees what the README's walk-through and the docs quote (a parser that finds nothing passes all).
    assert {"gpt_tf.train", "pipelines.finetune_data", "serving.export", "serving.server", "serving.client",
            "bench.speed_table", "bench.experiments.reproduction", "tools.torch_pretrain.convert",
            "tools.torch_pretrain.train"} <= set(modules)
    assert {"flagfile", "init_checkpoint", "lm_coef"} <= set(modules["gpt_tf.train"])
    line = "python -m bench.x --a=1 --b 2 | tee log  # --c"
    assert [(m.group(1), m.group(2).split()) for m in PYTHON_M.finditer(line)] == [("bench.x", ["--a=1", "--b", "2"])]


def test_every_quoted_module_exists_and_defines_the_flags_quoted_for_it():
    modules = quoted_modules()
    done = subprocess.run([sys.executable, "-c", PROBE, *sorted(modules)], cwd=ROOT, capture_output=True, text=True,
                          env=ENV, timeout=300)
    assert done.returncode == 0 and "@@" in done.stdout, done.stderr[-3000:]
    defined = json.loads(done.stdout.rsplit("@@", 1)[1])
    problems = []
    for module, quoted in sorted(modules.items()):
        where = ", ".join(sorted(quoted[""]))
        if "error" in defined[module]:
            problems.append(f"python -m {module} (quoted in {where}): {defined[module]['error']}")
            continue
        flags, bools = set(defined[module]["flags"]), set(defined[module]["bools"])
        for flag, docs in sorted(quoted.items()):
            if flag and flag not in flags and not (flag.startswith("no") and flag[2:] in bools):
                problems.append(f"python -m {module} --{flag} (quoted in {', '.join(sorted(docs))}): no such flag")
    assert not problems, "\n".join(problems)


def test_every_quoted_script_and_flagfile_exists():
    missing = []
    for doc in DOCS:
        for line in quoted_commands((ROOT / doc).read_text(encoding="utf-8")):
            paths = BASH.findall(line) + re.findall(r"--flagfile=(configs/[\w.-]+\.flags)\b", line)
            missing += [f"{doc}: {path}" for path in paths if not (ROOT / path).is_file()]
    assert not missing, missing


def test_every_project_file_the_docs_name_exists():
    docs = (*DOCS, *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "gpt_tf").rglob("presets/*/README.md")))
    missing = [f"{doc}:{number}: {path}" for doc in docs
               for number, line in enumerate((ROOT / doc).read_text(encoding="utf-8").splitlines(), 1)
               for path in PROJECT_FILE.findall(line) if not (ROOT / path).exists()]
    assert not missing, "\n".join(missing)
    assert PROJECT_FILE.findall("`tests/test_x.py::test_y`, configs/finetune_<task>_tiny.flags, ../bench/README.md") \
        == ["tests/test_x.py"]
