"""The suite's own scheduling (tests/conftest.py, scripts/test.sh): under pytest-xdist's ``--dist loadgroup``
each file (and tests/serving_e2e/ as a whole) is one group, and the longest groups are handed out first."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

from tests import conftest

ROOT = Path(__file__).resolve().parents[1]


def _group_mark(mark) -> str:
    """The group an ``xdist_group`` mark names, as pytest-xdist reads it (``None`` when there is no mark)."""
    return None if mark is None else (mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def test_every_longest_first_group_exists():
    """A renamed or deleted file left in LONGEST_FIRST would silently lose its place at the front."""
    groups = {p.stem for p in (ROOT / "tests").glob("test_*.py")} | {"serving_e2e"}
    assert (ROOT / "tests" / "serving_e2e").is_dir()
    assert [g for g in conftest.LONGEST_FIRST if g not in groups] == []
    assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)


def test_test_sh_keeps_the_collection_order_of_the_groups():
    """Without --no-loadscope-reorder xdist reorders the groups by their number of tests, and the long
    groups with few tests (the walk-through, the hot swaps) run last."""
    line = next(x for x in (ROOT / "scripts" / "test.sh").read_text().splitlines() if x.startswith("PYTEST=("))
    words = shlex.split(line.removeprefix("PYTEST=(").removesuffix(")"))
    assert words[words.index("--dist") + 1] == "loadgroup" and "--no-loadscope-reorder" in words, line


def test_the_hook_puts_the_longest_groups_first_and_keeps_files_together():
    def item(path):
        marks = []
        return SimpleNamespace(path=ROOT / path, originalname="test_it", marks=marks, add_marker=marks.append)

    paths = ["tests/test_a.py", "tests/serving_e2e/test_x.py", "tests/test_walkthrough.py", "tests/test_a.py",
             "tests/test_b.py", "tests/serving_e2e/test_y.py", "tests/test_walkthrough.py"]
    items = [item(p) for p in paths]
    conftest.pytest_collection_modifyitems(None, items)
    longest = sorted(["serving_e2e", "test_walkthrough"], key=conftest.LONGEST_FIRST.index)  # both listed there
    place = {"serving_e2e": ["tests/serving_e2e/test_x.py", "tests/serving_e2e/test_y.py"],
             "test_walkthrough": ["tests/test_walkthrough.py"] * 2}
    assert [str(i.path.relative_to(ROOT)) for i in items] == [
        *place[longest[0]], *place[longest[1]], "tests/test_a.py", "tests/test_a.py", "tests/test_b.py"]
    groups = [_group_mark(i.marks[0]) for i in items]
    assert groups == [longest[0]] * 2 + [longest[1]] * 2 + ["test_a"] * 2 + ["test_b"]
    assert all(m.name == "xdist_group" for i in items for m in i.marks)


def test_this_sessions_collection_is_in_that_order(request):
    """The items this session collected (the whole suite under scripts/test.sh): each group in one block,
    the LONGEST_FIRST groups first and in that order."""
    groups = [conftest.xdist_group(item.path) for item in request.session.items]
    blocks = [g for i, g in enumerate(groups) if i == 0 or g != groups[i - 1]]
    assert len(blocks) == len(set(blocks)), blocks
    first = [g for g in conftest.LONGEST_FIRST if g in blocks]
    assert blocks[:len(first)] == first, blocks
    assert [i.nodeid for i in request.session.items if _group_mark(i.get_closest_marker("xdist_group"))
            != conftest.xdist_group(i.path)] == []


def test_every_numerics_entry_names_a_test_and_test_sh_runs_them_again_with_onednn_flipped():
    """A renamed file or test left in NUMERICS would silently drop out of the second, flipped run."""
    import ast

    for entry in conftest.NUMERICS:
        stem, _, name = entry.partition("::")
        path = ROOT / "tests" / f"{stem}.py"
        assert path.is_file(), entry
        if name:
            tests = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
            assert name in tests, entry
    assert len(set(conftest.NUMERICS)) == len(conftest.NUMERICS)
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert 'TF_ENABLE_ONEDNN_OPTS=$flip "${PYTEST[@]}" -m numerics "$@"' in script
    assert "flip=$((1 - onednn))" in script and "IsMklEnabled()" in script


def test_the_hook_marks_the_numerics_tests():
    def item(path, name):
        marks = []
        return SimpleNamespace(path=ROOT / path, originalname=name, marks=marks, add_marker=marks.append)

    whole, one = next(e for e in conftest.NUMERICS if "::" not in e), next(e for e in conftest.NUMERICS if "::" in e)
    stem, name = one.split("::")
    items = [item(f"tests/{whole}.py", "test_anything"), item(f"tests/{stem}.py", name),
             item(f"tests/{stem}.py", "test_not_listed")]
    expected = {id(items[0]): True, id(items[1]): True, id(items[2]): False}
    conftest.pytest_collection_modifyitems(None, items)  # (it also reorders them)
    assert {id(i): any(m.name == "numerics" for m in i.marks) for i in items} == expected


def test_this_sessions_numerics_marks_are_the_list(request):
    """In this session, the marker sits on exactly the tests NUMERICS names."""
    for item in request.session.items:
        assert (item.get_closest_marker("numerics") is not None) == conftest.is_numerics(item), item.nodeid
