"""The command-line reference (docs/flags.md) is the code's: every flag of every command, none left out.

``tools/flag_reference.py`` finds the commands by reading the source and reads their flags off absl's definitions;
the docs build renders the page from them too (mkdocs.yml's hook). Here: the committed page equals what the code
gives, a flag added to a command appears in it, and every command line is in it.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

from absl import flags

from tools import flag_reference

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_page_is_the_codes():
    assert flag_reference.PAGE.read_text(encoding="utf-8") == flag_reference.generate(), (
        "docs/flags.md differs from the flag definitions: run python -m tools.flag_reference")


def test_a_flag_added_to_a_command_appears(monkeypatch):
    import serving.client
    import gpt_tf.train

    for module in (serving.client, gpt_tf.train):
        original = module.define_flags

        def with_one_more(original=original, name=module.__name__.replace(".", "_")):
            original()
            flags.DEFINE_integer(f"brand_new_{name}", 7, f"A flag {name} just grew.")

        monkeypatch.setattr(module, "define_flags", with_one_more)
    page = flag_reference.generate()
    assert "| `--brand_new_serving_client` | int | 7 | A flag serving_client just grew. |" in page
    assert "| `--brand_new_gpt_tf_train` | int | 7 |" in page
    assert "brand_new_serving_client" not in flags.FLAGS  # read, then removed again


def test_every_command_line_and_every_flag_is_in_the_page():
    page = flag_reference.generate()
    starts = {path for package in flag_reference.PACKAGES for path in (ROOT / package).rglob("*.py")
              if re.search(r"^\s+(?:app\.run|run_cli)\(", path.read_text(encoding="utf-8"), re.M)}
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__main__") for p in starts}
    modules.discard("gpt_tf.data.common")  # run_cli itself
    assert modules == {command for command, _, _ in flag_reference.commands()}
    for command in ("gpt_tf.train", "gpt_tf.convert", "gpt_tf.analysis.zero_shot", "serving.export",
                    "serving.server", "serving.client", "pipelines.finetune_data", "pipelines.pretrain_data"):
        assert f"## `{command}`" in page
    for script in ("gpt-tf-train", "gpt-tf-convert", "gpt-tf-export", "gpt-tf-serve", "gpt-tf-client"):
        assert f"`{script}`" in page
    # each DEFINE_*("name", ...) in the files that hold the commands' define functions, read as text
    missing = []
    for command, module, define in flag_reference.commands():
        source = Path(inspect.getsourcefile(getattr(importlib.import_module(module), define))).read_text()
        defined = re.findall(r'DEFINE_\w+\(\s*"(\w+)"', source)
        assert defined, command
        chapter = page.split(f"## `{command}`", 1)[1].split("\n## ", 1)[0]
        missing += [f"{command} --{name}" for name in defined if f"| `--{name}` |" not in chapter]
    assert not missing, missing
