r"""The command-line reference (``docs/flags.md``), generated from the commands' absl flag definitions.

    python -m tools.flag_reference           # rewrite docs/flags.md
    python -m tools.flag_reference --check   # exit 1 where docs/flags.md differs from the code

A command is a module of ``gpt_tf``, ``serving`` or ``pipelines`` that starts absl's ``app.run`` (or a pipeline's
``run_cli``) and has a ``define_flags()`` (or a pipeline's ``_define_flags(flags)``): it is found by reading the
source, so a new command is in the reference without being named here. Each command's flags are defined in this process, read off absl's ``FLAGS`` (name, type, default,
choices, whether required, help) and removed again, so commands sharing a flag name do not collide. Nothing
imports TensorFlow. The docs build (``mkdocs.yml``'s ``hooks``) renders the page from the code the same way
(``on_page_markdown``), and ``tests/test_flag_reference.py`` holds the committed file to the code.
"""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "flags.md"
PACKAGES = ("gpt_tf", "serving", "pipelines")
STARTS = re.compile(r"^\s+(?:app\.run|run_cli)\(", re.M)  # a command's start (common.py's own run_cli excepted)

INTRO = """\
# Command-line flags

<!-- Generated from the flag definitions by `python -m tools.flag_reference`; edit the code, not this page. -->

Every flag of every command, as the code defines it: name, default, and what it does. Each command also takes
absl's own flags (`--flagfile=FILE` reads flags from a file, one per line; `--helpfull` prints them all). A
boolean flag `--x` is turned off with `--nox` or `--x=false`. A list flag takes comma-separated values.
`configs/*.flags` are flagfiles for the recipes ([Training reference](training.md)).
"""


NOTES = """\
`gpt_tf.train` fine-tunes when `--task` is given; the flags it shares with pre-training then take the paper's
fine-tuning value when left unset (shown as "fine-tuning: …"; a flagfile's value counts as set).
"""


def console_scripts() -> dict[str, str]:
    """pyproject.toml's console scripts: {module: script name}."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    return {target.split(":")[0].removesuffix(".__main__"): name for name, target in scripts.items()}


def commands() -> list[tuple[str, str, str]]:
    """(command, importable module, define function) of every command line: the console scripts first, in
    pyproject.toml's order, then the others by name."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if not STARTS.search(text) or re.search(r"^def run_cli\(", text, re.M):
                continue
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            define = "define_flags" if re.search(r"\bdefine_flags\b", text) else "_define_flags"
            found.append((module.removesuffix(".__main__"), module, define))
    order = list(console_scripts())
    return sorted(found, key=lambda c: (order.index(c[0]) if c[0] in order else len(order), c[0]))


def read_flags(module: str, define: str) -> list[dict]:
    """The flags ``module``'s ``define`` function defines, in definition order; removed from ``FLAGS`` again."""
    from absl import flags

    aside = _set_aside(flags.FLAGS)  # what this process defined already (a test run's flags): out of the way
    try:
        return _read_defined(flags, module, define)
    finally:
        for owner, flag in aside:  # put back as they were
            for name in {flag.name, flag.short_name} - {None}:
                flags.FLAGS[name] = flag
            flags.FLAGS.register_flag_by_module(owner, flag)


def _set_aside(flag_values) -> list:
    """The flags the project's modules (and tests) defined in this process, removed from ``flag_values``:
    ``[(defining module, flag)]``, so that a command's ``define_flags`` defines its flags afresh (it does nothing,
    or fails as a duplicate, where they or another command's are defined)."""
    ours = PACKAGES + ("bench", "tools", "tests")
    aside = [(owner, flag) for owner, flags_of in flag_values.flags_by_module_dict().items()
             if owner.split(".")[0] in ours for flag in flags_of]
    for _, flag in aside:
        for name in {flag.name, flag.short_name} - {None}:
            if name in flag_values:
                delattr(flag_values, name)
    return aside


def _read_defined(flags, module: str, define: str) -> list[dict]:
    before = set(flags.FLAGS)
    function = getattr(importlib.import_module(module), define)
    function(flags) if define == "_define_flags" else function()
    # flags whose unset value differs when fine-tuning (gpt_tf.train_flags.FINETUNE_DEFAULTS)
    finetune = getattr(sys.modules[function.__module__], "FINETUNE_DEFAULTS", {})
    names = [name for name in flags.FLAGS._flags() if name not in before]  # dict order: definition order
    found = []
    for name in names:
        flag = flags.FLAGS[name]
        if flag.name != name:
            continue  # a short name
        found.append({
            "name": name,
            "type": flag.flag_type(),
            "default": flag.default_as_str,
            "choices": list(getattr(flag.parser, "values", None) or getattr(flag.parser, "enum_values", None) or []),
            "required": any("must have a value other than None" in str(getattr(v, "message", ""))
                            for v in flag.validators),
            "finetune_default": finetune.get(name),
            "help": re.sub(r"^<[^>]*>: ", "", " ".join((flag.help or "").split())),  # absl's enum prefix
        })
    for name in names:
        delattr(flags.FLAGS, name)
    return found


def _cell(text: str) -> str:
    """Table cell text: a bar escaped, and what markdown would read as HTML or emphasis."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")


def _code(text: str) -> str:
    """Inline code that holds any text (backticks included)."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _default(flag: dict) -> str:
    if flag["required"]:
        return "required"
    value = flag["default"]
    if value is None:
        return "none"
    value = value.strip("'\"") if flag["type"] in ("string", "enum") or value.startswith("'") else value
    shown = value if flag["type"] in ("int", "float") else _code(value) if value else '`""`'  # numbers plain
    if flag.get("finetune_default") is not None:
        finetune = flag["finetune_default"]
        shown += f" (fine-tuning: {finetune if isinstance(finetune, (int, float)) else _code(str(finetune))})"
    return shown


def section(module: str, importable: str, define: str) -> str:
    script = console_scripts().get(module)
    doc = importlib.import_module(importable).__doc__ or ""
    summary = " ".join(doc.strip().split("\n\n")[0].split()) if doc else ""
    summary = re.sub(r"\s*python -m .*", "", summary).strip().removeprefix("Command line: ")
    summary = summary[:1].upper() + summary[1:]
    lines = [f"## `{module}`", ""]
    run = f"`python -m {module}`" + (f", or the console script `{script}`" if script else "")
    lines += [f"{summary.rstrip('.:')}. Run as {run}." if summary else f"Run as {run}.", ""]
    lines += ["| flag | type | default | what it does |", "|---|---|---|---|"]
    for flag in read_flags(importable, define):
        kind = flag["type"]
        if flag["choices"]:
            kind = "one of " + ", ".join(f"`{c}`" for c in flag["choices"])
        lines.append(f"| `--{flag['name']}` | {_cell(kind)} | {_cell(_default(flag))} | {_cell(flag['help'])} |")
    return "\n".join(lines) + "\n"


def generate() -> str:
    """The whole page."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    found = commands()
    index = ["| command | console script |", "|---|---|"]
    for module, _, _ in found:
        anchor = re.sub(r"[^\w\- ]", "", f"{module}".lower()).replace(" ", "-")
        script = console_scripts().get(module)
        index.append(f"| [`{module}`](#{anchor}) | {_code(script) if script else '–'} |")
    parts = [INTRO, "\n".join(index) + "\n", NOTES]
    parts += [section(*command) for command in found]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, **_) -> str:
    """mkdocs hook: the flags page rendered from the code at build time, whatever the committed file says."""
    return generate() if page.file.src_uri == "flags.md" else markdown


def main(argv: list[str]) -> int:
    text = generate()
    if "--check" in argv:
        if PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} differs from the flag definitions: run python -m tools.flag_reference",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
