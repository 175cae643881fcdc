"""Fine-tuning data: the task registry, official-format readers, TFRecords, task_dataset (the input
transformations themselves: tests/test_transforms.py)."""

import csv
import hashlib
import json
import re

import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.tasks import TASKS, TaskSpec, csv_task, get_task
from pipelines import finetune_data as fd
from gpt_tf.data import transforms
from gpt_tf.data.task_readers import CsvOptions, read_examples
from tests.small_runs import ENV


def test_task_registry():
    assert len(TASKS) == 13 and get_task("SST-2").name == "sst2"
    assert get_task("mnli").eval_splits == ("dev_matched", "dev_mismatched")
    assert TaskSpec.from_dict(json.loads(json.dumps(get_task("race").to_dict()))) == get_task("race")
    with pytest.raises(ValueError, match="known tasks: .*sst2"):
        get_task("imdb")
    with pytest.raises(ValueError, match="choice"):
        TaskSpec("bad", "multiple_choice", "classification", ("a", "b"), ("accuracy",))


# ---------------------------------------------------------------- (2) readers on real data

REAL = [("sst2", "glue/SST-2", "train", 67349), ("sst2", "glue/SST-2", "dev", 872),
        ("cola", "glue/CoLA", "train", 8551), ("cola", "glue/CoLA", "dev", 1043),
        ("mrpc", "glue/MRPC", "train", 3668), ("mrpc", "glue/MRPC", "dev", 408),
        ("stsb", "glue/STS-B", "train", 5749), ("stsb", "glue/STS-B", "dev", 1500),
        ("rte", "glue/RTE", "train", 2490), ("rte", "glue/RTE", "dev", 277),
        ("qnli", "glue/QNLI", "dev", 5463), ("story_cloze", "story_cloze", "val", 1871)]


@pytest.mark.parametrize("task,folder,split,count", REAL)
def test_real_readers_count_and_labels(shared_data, task, folder, split, count):
    spec = get_task(task)
    examples, skipped = read_examples(spec, shared_data / folder, split)
    assert len(examples) == count and skipped == []
    assert len({e.guid for e in examples}) == count
    assert all(e.text_a.strip() and (e.text_b is None) == (spec.input_type in ("single", "multiple_choice"))
               for e in examples)
    if spec.head == "regression":
        assert all(0.0 <= e.label <= 5.0 for e in examples)
    else:
        assert {e.label for e in examples} == set(range(spec.num_labels))
    # Independent oracle: the last tab-separated field of each GLUE line is its label.
    if folder.startswith("glue/") and task not in ("cola", "mrpc"):
        lines = (shared_data / folder / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
        raw = [line.rsplit("\t", 1)[1] for line in lines]
        want = [float(r) if spec.head == "regression" else spec.label_names.index(r) if r in spec.label_names
                else int(r) for r in raw]
        assert [e.label for e in examples] == want


def test_real_story_cloze_and_mrpc_fields(shared_data):
    ex, _ = read_examples(get_task("story_cloze"), shared_data / "story_cloze", "val")
    with open(next((shared_data / "story_cloze").glob("*val*.csv")), encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [e.guid for e in ex] == [r["InputStoryid"] for r in rows]
    assert [e.label for e in ex] == [int(r["AnswerRightEnding"]) - 1 for r in rows]
    assert ex[0].choices == (rows[0]["RandomFifthSentenceQuiz1"], rows[0]["RandomFifthSentenceQuiz2"])
    assert ex[0].text_a == " ".join(rows[0][f"InputSentence{i}"] for i in range(1, 5))
    ex, _ = read_examples(get_task("mrpc"), shared_data / "glue/MRPC", "dev")
    assert ex[0].text_b.startswith('" The foodservice pie')  # stray quote kept (QUOTE_NONE)


# ---------------------------------------------------------------- (2b) official-format samples

def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def tsv(*rows):
    return "".join("\t".join(map(str, r)) + "\n" for r in rows)


MNLI_TRAIN = ("index promptID pairID genre sentence1_binary_parse sentence2_binary_parse sentence1_parse "
              "sentence2_parse sentence1 sentence2 label1 gold_label").split()
MNLI_DEV = MNLI_TRAIN[:-1] + ["label2", "label3", "label4", "label5", "gold_label"]


def mnli_row(i, s1, s2, gold, columns):
    rec = dict.fromkeys(columns, "x")
    rec.update(index=i, sentence1=s1, sentence2=s2, gold_label=gold)
    return [rec[c] for c in columns]


def test_qqp_and_mnli_samples(tmp_path):
    qqp = tmp_path / "QQP"
    write(qqp / "train.tsv", tsv(["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                                 [7, 1, 2, 'How do I "learn" Go?', "How to learn Go?", 1], [8, 3, 4, "Why?", "How?", 0]))
    write(qqp / "test.tsv", tsv(["id", "question1", "question2"], [0, "a?", "b?"]))
    ex, _ = read_examples(get_task("qqp"), qqp, "train")
    assert [(e.guid, e.text_a, e.label) for e in ex] == [("train-7", 'How do I "learn" Go?', 1), ("train-8", "Why?", 0)]
    assert read_examples(get_task("qqp"), qqp, "test")[0][0].label is None
    mnli = tmp_path / "MNLI"
    write(mnli / "train.tsv", tsv(MNLI_TRAIN, mnli_row(0, "A man.", "A person.", "entailment", MNLI_TRAIN)))
    for name, gold in (("dev_matched", "contradiction"), ("dev_mismatched", "neutral")):
        write(mnli / f"{name}.tsv", tsv(MNLI_DEV, mnli_row(0, "P.", "H.", gold, MNLI_DEV),
                                        mnli_row(1, "P2.", "H2.", "-", MNLI_DEV)))
    spec = get_task("mnli")
    assert [e.label for e in read_examples(spec, mnli, "train")[0]] == [0]
    ex, skipped = read_examples(spec, mnli, "dev_matched")
    assert [e.label for e in ex] == [2] and skipped[0]["line"] == 3 and "'-'" in skipped[0]["reason"]
    assert [e.label for e in read_examples(spec, mnli, "dev_mismatched")[0]] == [1]


def test_snli_scitail_race_samples(tmp_path):
    lines = [{"sentence1": "A dog runs.", "sentence2": "An animal moves.", "gold_label": "entailment", "pairID": "p1"},
             {"sentence1": "A dog runs.", "sentence2": "A cat sleeps.", "gold_label": "-", "pairID": "p2"},
             {"sentence1": "A dog runs.", "sentence2": "A dog sits.", "gold_label": "contradiction", "pairID": "p3"}]
    write(tmp_path / "snli/snli_1.0_dev.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    ex, skipped = read_examples(get_task("snli"), tmp_path / "snli", "dev")
    assert [(e.guid, e.label) for e in ex] == [("dev-p1", 0), ("dev-p3", 2)]
    assert [(s["line"], "no annotator consensus" in s["reason"]) for s in skipped] == [(2, True)]
    write(tmp_path / "SciTailV1.1/tsv_format/scitail_1.0_train.tsv",
          tsv(["Plants need light.", "Light is needed by plants.", "entails"], ["Rocks.", "Water.", "neutral"]))
    ex, _ = read_examples(get_task("scitail"), tmp_path, "train")
    assert [(e.text_b, e.label) for e in ex] == [("Light is needed by plants.", 0), ("Water.", 1)]
    for level, n in (("middle", 2), ("high", 1)):
        art = {"id": f"{level}1.txt", "article": f"A {level} article.", "questions": ["Q1?", "_ is true."][:n],
               "options": [["a", "b", "c", "d"], ["e", "f", "g", "h"]][:n], "answers": ["B", "D"][:n]}
        write(tmp_path / f"RACE/dev/{level}/1.txt", json.dumps(art))
    race = get_task("race")
    ex, _ = read_examples(race, tmp_path, "dev")
    assert [(e.guid, e.label) for e in ex] == [("dev/middle/1#1", 1), ("dev/middle/1#2", 3), ("dev/high/1#1", 1)]
    assert ex[1].text_a == "A middle article." and ex[1].text_b == "_ is true." and ex[1].choices == tuple("efgh")
    assert len(read_examples(race, tmp_path / "RACE", "dev_high")[0]) == 1


def test_generic_csv_reader(tmp_path):
    write(tmp_path / "train.csv", 'id,review,score\n1,"Good, really good",pos\n2,Bad,neg\n3,"Say ""hi""",neu\n')
    opts = CsvOptions("review", label_column="score", guid_column="id")
    ex, _ = read_examples(get_task("csv"), tmp_path, "train", csv_options=opts)
    assert [(e.guid, e.text_a, e.label) for e in ex] == [("train-1", "Good, really good", 2), ("train-2", "Bad", 0),
                                                         ('train-3', 'Say "hi"', 1)]  # neg < neu < pos
    given = CsvOptions("review", label_column="score", label_names=("neg", "pos", "neu"))
    assert [e.label for e in read_examples(get_task("csv"), tmp_path / "train.csv", "train", csv_options=given)[0]] == [1, 0, 2]
    write(tmp_path / "pairs/dev.tsv", tsv(["a", "b", "y"], ["x \" y", "z", 10], ["u", "v", 9]))
    ex, _ = read_examples(csv_task("pair"), tmp_path / "pairs", "dev", csv_options=CsvOptions("a", "b", "y"))
    assert [(e.text_a, e.text_b, e.label) for e in ex] == [('x " y', "z", 1), ("u", "v", 0)]  # 9 < 10 numerically


# ---------------------------------------------------------------- (3) malformed rows

BAD_CASES = [  # task, file, split, content, bad line, reason
    ("sst2", "train.tsv", "train", tsv(["sentence", "label"], ["a", "b", 0], ["fine", 1]), 2,
     "expected 2 columns"),
    ("sst2", "train.tsv", "train", tsv(["sentence", "label"], ["good", 1], ["bad", 2]), 3, "unknown label '2'"),
    ("rte", "train.tsv", "train", tsv(["index", "sentence1", "sentence2", "label"], [0, "p", " ", "entailment"],
                                      [1, "p", "h", "entailment"]), 2, "empty sentence2"),
    ("stsb", "dev.tsv", "dev", tsv(["sentence1", "sentence2", "score"], ["a", "b", "n/a"], ["a", "b", "1"]), 2,
     "score 'n/a' is not a number"),
    ("stsb", "dev.tsv", "dev", tsv(["sentence1", "sentence2", "score"], ["a", "b", "4.0"], ["a", "b", "5.5"]), 3,
     "outside"),
    ("cola", "dev.tsv", "dev", tsv(["src", 1, "", "Fine."], ["src", 0, "*"]), 2, "expected 4 columns"),
    ("snli", "snli_1.0_train.jsonl", "train",
     '{"sentence1": "a", "sentence2": "b", "gold_label": "entailment"}\n{oops\n', 2, "invalid JSON"),
    ("story_cloze", "cloze_test_val__spring2016.csv", "val",
     "InputStoryid,InputSentence1,InputSentence2,InputSentence3,InputSentence4,RandomFifthSentenceQuiz1,"
     "RandomFifthSentenceQuiz2,AnswerRightEnding\ns1,a,b,c,d,e,f,1\ns2,a,b,c,d,e,f,3\n", 3, "unknown AnswerRightEnding"),
]


@pytest.mark.parametrize("task,name,split,text,line,reason", BAD_CASES)
def test_malformed_rows_error_or_are_counted(tmp_path, task, name, split, text, line, reason):
    path = write(tmp_path / name, text)
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}:{line}: .*{re.escape(reason)}"):
        read_examples(get_task(task), tmp_path, split)
    examples, skipped = read_examples(get_task(task), tmp_path, split, skip_malformed=True)
    assert len(skipped) == 1 and skipped[0]["file"] == str(path) and skipped[0]["line"] == line
    assert reason in skipped[0]["reason"] and len(examples) == 1


def test_race_bad_answer_is_reported(tmp_path):
    art = {"article": "Text.", "questions": ["Q?", "R?"], "options": [list("abcd"), list("abcd")], "answers": ["A", "E"]}
    path = write(tmp_path / "RACE/train/high/9.txt", json.dumps(art))
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}:1: question 2: unknown answer 'E'"):
        read_examples(get_task("race"), tmp_path, "train")
    ex, skipped = read_examples(get_task("race"), tmp_path, "train", skip_malformed=True)
    assert len(ex) == 1 and len(skipped) == 1


# ---------------------------------------------------------------- (4) end to end

@pytest.fixture(scope="module")
def tokenizer_dir(shared_data):
    return shared_data / "gpt1_bpe"


def test_skipped_rows_reach_the_manifest(tmp_path, tokenizer_dir):
    write(tmp_path / "in/train.tsv", tsv(["sentence", "label"], ["good", 1], ["x", "y", 0], ["bad", 7], ["ok", 0],
                                         ["\ufeff", 1]))  # a BOM alone encodes to no token
    with pytest.raises(ValueError, match=r"train.tsv:3: "):
        fd.build_task_data("sst2", tmp_path / "in", tokenizer_dir, tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()  # nothing half-written
    m = fd.build_task_data("sst2", tmp_path / "in", tokenizer_dir, tmp_path / "out", skip_malformed=True,
                           show_progress=False)
    assert m["counts"] == {"train": 2} and m["skipped_count"] == 3
    assert [(s["line"], s["split"]) for s in m["skipped"]] == [(3, "train"), (4, "train"), (None, "train")]
    assert all(s["file"].endswith("train.tsv") for s in m["skipped"][:2]) and "'train-6'" in m["skipped"][2]["reason"]
    assert all(s["reason"].startswith("malformed") for s in m["skipped"])
    assert json.loads((tmp_path / "out/manifest.json").read_text())["skipped"] == m["skipped"]
    from gpt_tf.text.tokenizer import GPTTokenizer
    from gpt_tf.data.task_rows import Example

    with pytest.raises(ValueError, match="'g1': text_b encodes to no token"):
        fd.tokenize_examples(GPTTokenizer.from_dir(tokenizer_dir), [Example("g1", "a", "\x00", None, 0)])


@pytest.fixture(scope="module")
def built(shared_data, tokenizer_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ft")
    for task, folder in (("rte", "glue/RTE"), ("sst2", "glue/SST-2")):
        fd.build_task_data(task, shared_data / folder, tokenizer_dir, out / task, max_examples=40,
                           show_progress=False)
    return out


def read_records(path):
    return [transforms.parse_record(s) for s in tf.data.TFRecordDataset(str(path), compression_type="GZIP")]


def test_records_hold_the_tokens_of_the_examples(built, shared_data, tokenizer_dir):
    from gpt_tf.text.tokenizer import GPTTokenizer

    tok = GPTTokenizer.from_dir(tokenizer_dir)
    examples, _ = read_examples(get_task("rte"), shared_data / "glue/RTE", "dev")
    records = read_records(built / "rte" / "dev.tfrecord.gz")
    assert len(records) == 40
    for e, r in zip(examples, records):
        assert r["guid"].numpy().decode() == e.guid and int(r["label"]) == e.label
        assert r["tokens_a"].numpy().tolist() == tok.encode(e.text_a)
        assert r["tokens_b"].numpy().tolist() == tok.encode(e.text_b) and r["choice_lengths"].shape == [0]
    m = json.loads((built / "rte/manifest.json").read_text())
    assert m["task"] == "rte" and m["counts"] == {"train": 40, "dev": 40} and m["tokenizer"]["vocab_size"] == 40478
    assert m["splits"]["dev"]["sha256"] == hashlib.sha256((built / "rte/dev.tfrecord.gz").read_bytes()).hexdigest()


@pytest.mark.parametrize("task,k", [("rte", 1), ("sst2", 1)])
def test_task_dataset_batches(built, shared_data, task, k):
    spec, special = get_task(task), {"start": 40478, "delimiter": 40479, "extract": 40480, "pad": 40481}
    ds = transforms.task_dataset(spec, str(built / task), "dev", batch_size=16, n_ctx=64, special_ids=special,
                                 buckets=(64,))  # one bucket: every batch padded to n_ctx, in file order
    batches = list(ds)
    assert [int(b[1].shape[0]) for b in batches] == [16, 16, 16]
    index = np.concatenate([b[0]["record_index"].numpy() for b in batches])
    assert index.tolist() == list(range(40)) + [-1] * 8  # 8 ghost rows fill the last batch
    feats, labels = batches[0]
    assert feats["input_ids"].shape == (16, k, 64) and feats["input_ids"].dtype == tf.int32
    assert feats["extract_index"].shape == (16, k) and feats["lm_weights"].shape == (16, k, 64)
    assert labels.dtype == tf.int32
    examples, _ = read_examples(spec, shared_data / ("glue/RTE" if task == "rte" else "glue/SST-2"), "dev")
    assert np.concatenate([b[1].numpy() for b in batches])[:40].tolist() == [e.label for e in examples[:40]]
    ids, ext = feats["input_ids"].numpy(), feats["extract_index"].numpy()
    assert (ids[:, 0, 0] == 40478).all() and (np.take_along_axis(ids[:, 0], ext, 1) == 40480).all()
    assert (feats["lm_weights"].numpy().sum(-1) == ext).all()
    shuffled = transforms.task_dataset(spec, str(built / task), "dev", 8, 64, special, training=True, seed=3)
    assert all(b[1].shape == (8,) for b in shuffled.take(7))  # repeats past the 40 records


def test_task_dataset_checks_task_and_special_ids(built):
    special = {"start": 40478, "delimiter": 40479, "extract": 40480, "pad": 40481}
    with pytest.raises(ValueError, match="built for task 'rte'"):
        transforms.task_dataset(get_task("qnli"), str(built / "rte"), "dev", 4, 32, special)
    with pytest.raises(ValueError, match="vocab_size 40478"):
        transforms.task_dataset(get_task("rte"), str(built / "rte"), "dev", 4, 32, dict(special, pad=5))
    with pytest.raises(ValueError, match="no split 'test'"):
        transforms.task_dataset(get_task("rte"), str(built / "rte"), "test", 4, 32, special)


def test_story_cloze_holdout_is_deterministic(shared_data, tokenizer_dir, tmp_path):
    kw = dict(holdout_fraction=0.2, show_progress=False)
    m = fd.build_task_data("story_cloze", shared_data / "story_cloze", tokenizer_dir, tmp_path / "a", **kw)
    assert m["holdout"]["source_split"] == "val" and m["counts"]["train"] + m["counts"]["dev"] == 1871
    dev = {r["guid"].numpy().decode() for r in read_records(tmp_path / "a/dev.tfrecord.gz")}
    want = {e.guid for e in read_examples(get_task("story_cloze"), shared_data / "story_cloze", "val")[0]
            if int(hashlib.sha256(e.guid.encode()).hexdigest()[:15], 16) / 16 ** 15 < 0.2}
    assert dev == want and 0.15 < len(dev) / 1871 < 0.25
    again = fd.build_task_data("story_cloze", shared_data / "story_cloze", tokenizer_dir, tmp_path / "b", **kw)
    assert again["splits"] == m["splits"]  # same bytes (sha256) in a fresh folder
    assert fd.build_task_data("story_cloze", shared_data / "story_cloze", tokenizer_dir, tmp_path / "a", **kw) == m
    with pytest.raises(ValueError, match="--overwrite"):
        fd.build_task_data("story_cloze", shared_data / "story_cloze", tokenizer_dir, tmp_path / "a",
                           show_progress=False, holdout_fraction=0.3)
    feats, labels = next(iter(transforms.task_dataset(get_task("story_cloze"), str(tmp_path / "a"), "dev", 4, 128,
                                                      {"start": 40478, "delimiter": 40479, "extract": 40480, "pad": 40481})))
    assert feats["input_ids"].shape[:2] == (4, 2) and set(labels.numpy()) <= {0, 1}


def test_race_build_adds_race_all_and_shards_are_disjoint(tmp_path, tokenizer_dir):
    for level, answers in (("middle", ["A", "C"]), ("high", ["D"])):
        art = {"article": f"The {level} school article is long enough.", "questions": ["Who?", "What?"][:len(answers)],
               "options": [["one", "two", "three", "four"]] * len(answers), "answers": answers}
        write(tmp_path / f"RACE/dev/{level}/1.txt", json.dumps(art))
    m = fd.build_task_data("race", tmp_path, tokenizer_dir, tmp_path / "out", show_progress=False)
    assert m["counts"] == {"dev_middle": 2, "dev_high": 1, "dev": 3}
    assert m["splits"]["dev"]["label_counts"] == {"A": 1, "B": 0, "C": 1, "D": 1}
    special = {"start": 40478, "delimiter": 40479, "extract": 40480, "pad": 40481}
    parts = []
    for i in range(2):  # each of 2 workers gets its half of every global batch of 2
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i, num_replicas_in_sync=2)
        ds = transforms.task_dataset(get_task("race"), str(tmp_path / "out"), "dev", 2, 32, special, input_context=ctx)
        parts.append([(int(f["record_index"][0]), int(label[0])) for f, label in ds])
    assert parts == [[(0, 0), (2, 3)], [(1, 2), (-1, 0)]]  # -1: the ghost row that fills the last batch
    feats, _ = next(iter(transforms.task_dataset(get_task("race"), str(tmp_path / "out"), "dev", 3, 32, special)))
    assert feats["input_ids"].shape[:2] == (3, 4)


def test_cli_builds_a_generic_csv_task(tmp_path, tokenizer_dir):
    import subprocess
    import sys
    from pathlib import Path

    rows = "text,label\n" + "".join(f"sample number {i},{'yes' if i % 3 else 'no'}\n" for i in range(30))
    write(tmp_path / "in/train.csv", rows)
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "pipelines.finetune_data", "--task=csv", f"--data_dir={tmp_path / 'in'}",
           f"--tokenizer_dir={tokenizer_dir}", f"--output_dir={tmp_path / 'out'}", "--text_a_column=text",
           "--holdout_fraction=0.3", "--noprogress"]
    done = subprocess.run(cmd, cwd=root, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    spec = transforms.load_task_spec(str(tmp_path / "out"))
    assert spec.label_names == ("no", "yes") and spec.input_type == "single"
    assert transforms.num_examples(str(tmp_path / "out"), "train") + transforms.num_examples(
        str(tmp_path / "out"), "dev") == 30
    bad = subprocess.run(cmd[:-2] + ["--text_a_column=nope"], cwd=root, env=ENV, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "missing column(s) ['nope']" in bad.stderr


def test_train_subsample_is_a_fixed_hash_sample(shared_data, tokenizer_dir, tmp_path):
    rte = shared_data / "glue" / "RTE"
    m = fd.build_task_data("rte", rte, tokenizer_dir, tmp_path / "a", train_subsample=100, show_progress=False)
    assert m["counts"] == {"train": 100, "dev": 277}
    assert m["train_subsample"]["kept"] == 100 and m["train_subsample"]["available"] == 2490
    guids = [e.guid for e in read_examples(get_task("rte"), rte, "train")[0]]
    want = set(sorted(guids, key=lambda g: int(hashlib.sha256(g.encode()).hexdigest()[:15], 16))[:100])
    got = [r["guid"].numpy().decode() for r in read_records(tmp_path / "a/train.tfrecord.gz")]
    assert set(got) == want and got == [g for g in guids if g in want]  # file order kept
    # After a hold-out the sample is drawn from what stayed in train.
    m = fd.build_task_data("rte", rte, tokenizer_dir, tmp_path / "b", splits=["train"], holdout_fraction=0.5,
                           train_subsample=50, show_progress=False)
    dev = {r["guid"].numpy().decode() for r in read_records(tmp_path / "b/dev.tfrecord.gz")}
    train = {r["guid"].numpy().decode() for r in read_records(tmp_path / "b/train.tfrecord.gz")}
    assert m["counts"]["train"] == 50 and len(train) == 50 and not train & dev
    with pytest.raises(ValueError, match="--train_subsample must be positive"):
        fd.build_task_data("rte", rte, tokenizer_dir, tmp_path / "c", train_subsample=0, show_progress=False)


def test_a_missing_or_empty_data_dir_is_named_as_such(tmp_path, tokenizer_dir):
    missing = tmp_path / "glue" / "RTE"
    with pytest.raises(FileNotFoundError, match=f"{re.escape(str(missing))} does not exist: --data_dir is the folder "
                                                "of rte's files in their official layout"):
        fd.build_task_data("rte", missing, tokenizer_dir, tmp_path / "out")
    missing.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"no split of task 'rte' found: .*RTE: no file for split 'train'; "
                                                r"looked for train\.tsv"):
        fd.build_task_data("rte", missing, tokenizer_dir, tmp_path / "out")
