"""bench/experiments/stsb_explained.py: the STS-B section is written from the runs' TensorBoard curves, the
probe's JSON and both ledgers (the right cells of each), and rewriting it keeps the rest of the page."""

import json
from types import SimpleNamespace

import pytest
import tensorflow as tf

from bench.experiments import stsb_explained as se
from bench.experiments.finetune_runs import replace_section
from bench.experiments.reference_finetune import task_recipe


def _curve_run(run_dir, scores):
    writer = tf.summary.create_file_writer(str(run_dir / "tb"))
    with writer.as_default():
        for epoch, score in enumerate(scores, 1):
            tf.summary.scalar("dev/pearson", score, step=100 * epoch)
            tf.summary.scalar("dev/spearman", score / 2, step=100 * epoch)
    writer.close()


def _cell(arm, seed, pearson, recipe, task="stsb"):
    return {"task": task, "arm": arm, "seed": seed, "recipe": recipe, "metrics": {"dev": {"pearson": pearson}}}


def test_the_section_holds_the_curves_the_probe_and_the_matching_cells(tmp_path):
    recipe = task_recipe("stsb")
    _curve_run(tmp_path / "curves" / "pretrained_s0", [0.1 * i for i in range(1, 11)])
    _curve_run(tmp_path / "curves" / "scratch_s0", [0.05, 0.2, 0.15])
    ours = [{"task": "stsb", "arm": arm, "seed": s, "recipe": {"n_ctx": "96", "learning_rate": "1e-3", "epochs": "3",
                                                               "warmup_fraction": "0.05"},
             "cmd": "python -m gpt_tf.train --n_ctx=96", "metrics": {"dev": {"pearson": p}}}
            for arm, s, p in (("pretrained", 0, 0.25), ("pretrained", 1, 0.19), ("scratch", 0, 0.15))]
    ours.append({**ours[0], "seed": 2, "recipe": {**ours[0]["recipe"], "learning_rate": "2.5e-4"},
                 "metrics": {"dev": {"pearson": 0.99}}})  # another recipe: not this section's cell
    reference = [_cell("pretrained", 0, 0.275, recipe), _cell("pretrained", 1, 0.31, recipe),
                 _cell("pretrained", 2, 0.99, {**recipe, "epochs": 10}),  # the 10-epoch curve, not a 3-epoch cell
                 _cell("pretrained", 0, 0.99, task_recipe("mrpc"), task="mrpc")]
    for name, rows in (("ours.jsonl", ours), ("ref.jsonl", reference)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "probe.json").write_text(json.dumps(
        {"command": "python -m bench.experiments.frozen_probe", "dev_pearson": {"pretrained": {"1": 0.18, "100": 0.21},
                                                                              "random": {"1": 0.12, "100": 0.1}}}))
    page = tmp_path / "results.md"
    page.write_text("# Results\n\nkept above\n\n" + se.SECTION[0] + "\nold text\n" + se.SECTION[1] + "\n\nkept below\n")
    args = SimpleNamespace(curves=tmp_path / "curves", ours=tmp_path / "ours.jsonl", reference=tmp_path / "ref.jsonl",
                           probe=tmp_path / "probe.json", out=tmp_path / "stsb.json", figure=tmp_path / "stsb.png",
                           report=page)
    se.write(args)

    data = json.loads((tmp_path / "stsb.json").read_text())
    assert data["curves"]["pretrained"]["dev_pearson_by_epoch"] == pytest.approx([10.0 * i for i in range(1, 11)])
    assert data["cells_3_epochs"] == {"pretrained": [19.0, 25.0], "scratch": [15.0], "reference": [27.5, 31.0]}
    text = page.read_text()
    assert text.startswith("# Results\n\nkept above\n") and text.endswith("\n\nkept below\n")
    assert "old text" not in text and text.count(se.SECTION[0]) == 1
    assert "| ours, pre-trained (`books_tiny`) | 22.0 [19.0–25.0] (2) | 100.0 (10) | 100.0 | 21.0 (ridge 100) |" in text
    assert "| ours, from scratch | 15.0 [15.0–15.0] (1) | 20.0 (2), 3 of 10 run | – | 12.0 (ridge 1) |" in text
    assert "29.2 [27.5–31.0] (2)" in text
    assert (tmp_path / "stsb.png").stat().st_size > 10_000

    # the runs gone (runs/ is not committed): the curves come from the JSON of the last pass
    args.curves = tmp_path / "nowhere"
    se.write(args)
    assert json.loads((tmp_path / "stsb.json").read_text())["curves"] == data["curves"]


def test_a_run_without_the_pearson_curve_is_named(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path / "tb"))
    with writer.as_default():
        tf.summary.scalar("dev/accuracy", 0.5, step=1)
    writer.close()
    with pytest.raises(ValueError, match="no dev/pearson"):
        se.read_curve(tmp_path)


def test_replace_section_appends_when_the_page_has_none(tmp_path):
    page = tmp_path / "r.md"
    page.write_text("# R\n")
    replace_section(page, ("<!-- a: written by x -->", "<!-- /a -->"), ["one"])
    assert page.read_text() == "# R\n\n<!-- a: written by x -->\none\n<!-- /a -->\n"
