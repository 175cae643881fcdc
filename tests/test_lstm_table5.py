"""bench/experiments/lstm_table5.py: the LSTM row's books, recipe, ledger skips and the row written into Table 5.

No model runs here (the trainer and fine-tuning CLIs are tested elsewhere); records are synthetic.
"""

from __future__ import annotations

from pathlib import Path

from bench.experiments import lstm_table5 as lt


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
    lt.write_report(md, records[:3] + records[3:4])  # one cell so far
    first = md.read_text()
    assert "| LSTM w/ aux LM | – | 10.0 | – | – |" in first and "2.0M tokens, 0.8% of" in first
    lt.write_report(md, records)  # written again: the row and the note replaced, not repeated
    text = md.read_text()
    assert "| LSTM w/ aux LM | 40.0 | 10.0 [5.0–20.0] | 50.0 | 60.0 |" in text
    assert text.count(lt.NOTE_START) == 1 and text.count("| LSTM w/ aux LM |") == 1
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
