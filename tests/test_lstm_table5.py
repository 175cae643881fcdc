"""bench/experiments/lstm_table5.py: the LSTM row's books, recipe, ledger skips and the row written into Table 5.

No model runs here (the trainer and fine-tuning CLIs are tested elsewhere); records are synthetic.
"""

from __future__ import annotations

from pathlib import Path

from bench.experiments import lstm_table5 as lt
from bench.experiments import lstm_table5_report as report


def test_books_are_every_nth_train_book_and_the_first_held_out(tmp_path):
    index = tmp_path / "index.tsv"
    rows = [f"b{i:04d}\t{'valid' if i % 5 == 4 else 'train'}\ta\tt\t10" for i in range(20)]
    index.write_text("id\tsplit\tauthor\ttitle\tbytes\n" + "\n".join(reversed(rows)) + "\n")
    picked = lt.pick_books(index, every=4, valid=2)
    assert picked == {"train": ["b0000", "b0005", "b0010", "b0015"], "valid": ["b0004", "b0009"]}


def test_pretraining_is_books_tiny_recipe_scaled_to_the_steps():
    run_dir, cmd = lt.pretrain_cmd("runs/x", "data/books_sub", 72)
    flags = dict(a[2:].partition("=")[::2] for a in cmd if a.startswith("--"))
    assert run_dir == str(Path("runs/x") / "lstm_tiny") and flags["model"] == "lstm_tiny"
    assert flags["data_dir"] == "data/books_sub" and flags["train_steps"] == "72"
    assert (flags["batch_size"], flags["learning_rate"], flags["weight_decay"], flags["clip_norm"]) == ("256", "0.001",
                                                                                                       "0.01", "1.0")
    assert flags["lr_decay"] == "cosine" and flags["precision"] == "float32" and flags["seed"] == "0"
    assert flags["warmup_steps"] == str(round(143 * 72 / 7158))  # books_tiny: 143 of 7,158 updates


def _finetune(task, seed, score):
    metric = {"cola": "matthews", "rte": "accuracy", "story_cloze": "accuracy"}[task]
    return {"kind": "finetune", "task": task, "seed": seed, "metrics": {"dev": {metric: score}},
            "cmd": f"python -m gpt_tf.train --task={task}", "finished": "2026-11-26T05:00:00"}


def test_row_and_note_in_results_md(tmp_path):
    done = {"kind": "pretrain_done", "to_step": 60, "tokens": 60 * 256 * 128, "cpu": "AMD EPYC", "cmd": "python -m x",
            "finished": "2026-11-26T04:40:00"}
    pieces = [{"kind": "pretrain_piece", "seconds": 600.0}, {"kind": "pretrain_piece", "seconds": 300.0}]
    records = [done, *pieces, _finetune("cola", 0, 0.10), _finetune("cola", 1, 0.20), _finetune("cola", 2, 0.05),
               _finetune("rte", 0, 0.5), _finetune("story_cloze", 0, 0.6)]
    md = tmp_path / "results.md"
    md.write_text("| method | avg | cola | rte | story_cloze |\n|---|---:|---:|---:|---:|\n| full | 1 | 2 | 3 | 4 |\n"
                  "| LSTM w/ aux LM | – | – | – | – |\n\n**Pre-training vs none:** ...\n")
    report.write_report(md, records[:3] + records[3:4])  # one cell so far
    first = md.read_text()
    assert "| LSTM w/ aux LM | – | 10.0 | – | – |" in first and "2.0M tokens, 0.8% of" in first
    report.write_report(md, records)  # written again: the row and the note replaced, not repeated
    text = md.read_text()
    assert "| LSTM w/ aux LM | 40.0 | 10.0 [5.0–20.0] | 50.0 | 60.0 |" in text
    assert text.count(report.NOTE_START) == 1 and text.count("| LSTM w/ aux LM |") == 1
    assert "2 pieces, 15 min" in text and text.endswith("**Pre-training vs none:** ...\n")


def test_finetune_skips_cells_in_the_ledger(tmp_path, monkeypatch):
    ledger = tmp_path / "ledger.jsonl"
    lt.append_ledger(ledger, _finetune("rte", 0, 0.5))
    ran = []
    monkeypatch.setattr(lt, "run_one", lambda spec: ran.append((spec["task"], spec["seed"])) or
                        {**spec, "metrics": {"dev": {"accuracy": 0.5, "matthews": 0.1}}, "finished": "t", "seconds": 1})
    lt.finetune(ledger, lt.cell_specs("runs/x", "data/t", ["rte", "cola"], ["0", "1"]))
    assert ran == [("cola", 0), ("rte", 1), ("cola", 1)]
    lt.finetune(ledger, lt.cell_specs("runs/x", "data/t", ["rte", "cola"], ["0", "1"]))
    assert len(ran) == 3


def _gpu_log(tmp_path, name="lstm_tiny_run", **changes):
    """A bench.torch_pretrain.train log of the GPU route: books_tiny's setting on lstm_tiny, finished."""
    import json

    setting = {**json.loads(lt.BOOKS_LOG.read_text().splitlines()[0])["setting"], "model": "lstm_tiny",
               "device": "NVIDIA H100 80GB HBM3", **changes}
    run = tmp_path / name
    run.mkdir()
    rows = [{"setting": setting}, {"step": setting["steps"], "tokens": 1, "epoch": 6.9, "train_loss": 4.3,
                                    "valid_loss": 4.2, "valid_ppl": 66.7, "lr": 0.0, "seconds": 290.0},
            {"done": setting["steps"], "of": setting["steps"], "seconds": 300.0}]
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run, setting


def test_gpu_run_must_be_books_tiny_recipe_on_lstm_tiny(tmp_path):
    run, setting = _gpu_log(tmp_path)
    assert lt.gpu_recipe_problems(setting, {"done": 7158}) == []
    assert lt.gpu_recipe_problems({**setting, "model": "tiny"}, {"done": 7158}) == ["model is 'tiny', not 'lstm_tiny'"]
    assert lt.gpu_recipe_problems({**setting, "steps": 60}, {"done": 60}) == ["steps is 60, books_tiny's is 7158"]
    problems = lt.gpu_recipe_problems({**setting, "learning_rate": 5e-4, "warmup": 0}, None)
    assert any("not finished" in p for p in problems) and any("learning_rate" in p for p in problems)
    assert any(p.startswith("warmup is 0") for p in problems)


def test_import_stage_records_the_gpu_run_for_finetuning(tmp_path, monkeypatch):
    import json

    import pytest

    run, _ = _gpu_log(tmp_path)
    data = tmp_path / "books_tiny"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"splits": {"train": {"num_books": 389, "stream_tokens": 34178817,
                                                                         "sequences": 267022}}}))
    ran = []
    monkeypatch.setattr(lt.subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    ledger = tmp_path / "ledger.jsonl"
    lt.import_gpu_run(ledger, str(tmp_path / "runs"), str(data), str(run))
    flags = dict(a[2:].partition("=")[::2] for a in ran[0] if a.startswith("--"))
    assert ran[0][1:3] == ["-m", "bench.torch_pretrain.convert"] and flags["action"] == "import"
    assert flags["model"] == "lstm_tiny" and flags["run_dir"] == str(tmp_path / "runs" / "lstm_tiny")
    (done,) = lt.load_ledger(ledger)
    assert done["kind"] == "pretrain_done" and done["route"] == "gpu" and done["to_step"] == 7158
    assert lt.pretrain_log(ledger) == tmp_path / "ledger_pretrain_log.jsonl"  # the curve is kept beside the ledger
    assert lt.pretrain_log(ledger).read_text() == (run / "log.jsonl").read_text()
    assert done["tokens"] == 7158 * 256 * 128 and done["data"]["windows"] == 267022
    # fine-tuning starts from the imported run folder
    (spec,) = lt.cell_specs(str(tmp_path / "runs"), "t", ["rte"], ["0"])
    assert f"--init_checkpoint={flags['run_dir']}" in spec["cmd"]
    with pytest.raises(SystemExit, match="already holds a pre-training"):
        lt.import_gpu_run(ledger, str(tmp_path / "runs"), str(data), str(run))
    other, _ = _gpu_log(tmp_path, "other_run", batch_size=128)
    with pytest.raises(SystemExit, match="batch_size is 128"):
        lt.import_gpu_run(tmp_path / "other.jsonl", str(tmp_path / "runs2"), str(data), str(other))
    assert len(ran) == 1


def test_gpu_route_note_says_same_tokens(tmp_path):
    done = {"kind": "pretrain_done", "route": "gpu", "to_step": 7158, "tokens": 7158 * 256 * 128, "seconds": 300.0,
            "device": "NVIDIA H100 80GB HBM3", "valid_ppl": 66.7, "cmd": "python -m bench.torch_pretrain.convert",
            "data": {"dir": "data/books_tiny", "books": 389, "tokens": 34178817, "windows": 267022},
            "finished": "2026-11-27T01:00:00"}
    row, note = report.row_and_note([done, _finetune("rte", 0, 0.55)], ledger="bench/results/lstm_table5_books.jsonl")
    assert row == "| LSTM w/ aux LM | – | – | 55.0 | – |"
    assert "ledger `bench/results/lstm_table5_books.jsonl`" in note and "234.6M tokens, as the transformer's" in note
    assert "7,158 updates" in note and "NVIDIA H100" in note and "66.7" in note
    assert "not a like-for-like" not in note and "compares with the transformer's" in note
    assert "Seed 0 alone" not in note  # one seed: the row is seed 0 already


def test_note_gives_seed_0_beside_the_median_of_seeds():
    records = [_finetune("cola", 0, 0.10), _finetune("cola", 1, 0.20), _finetune("cola", 2, 0.05),
               _finetune("rte", 0, 0.50), _finetune("rte", 1, 0.60), _finetune("story_cloze", 1, 0.70)]
    row, note = report.row_and_note(records)
    assert row == "| LSTM w/ aux LM | 45.0 | 10.0 [5.0–20.0] | 55.0 [50.0–60.0] | 70.0 |"
    assert "Seed 0 alone, the seed of the rows above: cola 10.0, rte 50.0. " in note  # no avg: story_cloze lacks seed 0
    records.append(_finetune("story_cloze", 0, 0.80))
    assert "cola 10.0, rte 50.0, story_cloze 80.0 (avg 46.7). " in report.row_and_note(records)[1]


def test_gpu_report_draws_both_curves_and_links_them(tmp_path):
    run, _ = _gpu_log(tmp_path)
    ledger = tmp_path / "books.jsonl"
    md = tmp_path / "docs" / "results.md"
    md.parent.mkdir()
    md.write_text("| method | avg |\n|---|---:|\n| LSTM w/ aux LM | – |\n\nafter\n")
    done = {"kind": "pretrain_done", "route": "gpu", "to_step": 7158, "tokens": 7158 * 256 * 128, "seconds": 151.0,
            "device": "NVIDIA H100 80GB HBM3", "cmd": "python -m x", "finished": "2026-11-26T13:38:00"}
    report.write_report(md, [done], ledger=str(ledger), figure="curves.png")
    assert not (md.parent / "curves.png").exists() and "curves.png" not in md.read_text()  # no log kept: no figure
    lt.pretrain_log(ledger).write_text((run / "log.jsonl").read_text())
    report.write_report(md, [done], ledger=str(ledger), figure="curves.png")
    assert (md.parent / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = md.read_text()
    assert text.count("](curves.png)") == 1 and text.index("](curves.png)") < text.index(report.NOTE_END) < text.index("after")
    report.write_report(md, [done], ledger=str(ledger), figure="curves.png")  # again: replaced, not repeated
    assert md.read_text() == text


def test_note_names_the_transformer_with_the_same_recipes():
    records = [_finetune("cola", 0, 0.05), _finetune("rte", 0, 0.57), _finetune("story_cloze", 0, 0.65)]
    reference = {"cola": {0: 13.7, 1: 15.2, 2: 14.9}, "rte": {0: 58.1}, "story_cloze": {}}
    _, note = report.row_and_note(records, reference=reference)
    assert "same recipes and seeds" in note and "medians: cola 14.9, rte 58.1;" in note  # no runs: no story_cloze
    assert "same recipes" not in report.row_and_note(records)[1]
    reference["story_cloze"] = {0: 68.5}
    assert "story_cloze 68.5 (avg 47.2, the LSTM's 42.3);" in report.row_and_note(records, reference=reference)[1]


def test_reference_cells_are_the_reproduction_reports_chosen_recipe():
    import pytest

    from bench.experiments.reproduction import chosen_scores

    def run(task, arm, seed, lr, score):
        return {"stage": "sweep" if seed == 0 else "table", "task": task, "arm": arm, "seed": seed,
                "recipe": {"learning_rate": lr}, "metrics": {"dev": {"accuracy": score}}}

    records = [run("rte", "pretrained", 0, "1e-3", 0.50), run("rte", "pretrained", 0, "5e-4", 0.60),
               run("rte", "pretrained", 1, "5e-4", 0.58), run("rte", "pretrained", 1, "1e-3", 0.99),
               run("rte", "scratch", 0, "1e-3", 0.70)]
    assert chosen_scores(records, "pretrained", ["rte", "cola"]) == {"rte": {0: pytest.approx(60.0), 1: pytest.approx(58.0)}}
