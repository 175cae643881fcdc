"""Zero-shot heuristics (§5): the batched scorer against numpy, each heuristic's decision, the readers, the CLIs.

Real rows of SST-2, CoLA and Story Cloze from ../shared/data go through the suite with GPT-1's BPE;
RACE and DPRD (not in ../shared/data) are small samples written here in their official layouts.
Decisions are checked with planted language models whose preferences are known exactly. The CLI
test pre-trains the `lstm_test` baseline with periodic zero-shot evaluation, then re-scores its
kept checkpoints post hoc with `python -m gpt_tf.analysis.zero_shot`: the two must agree.
"""

from __future__ import annotations

import csv
import json
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.config import get_size
from gpt_tf.analysis.heuristics import HEURISTICS, ZeroShotConfig, ZeroShotSuite, best_threshold, normalised
from gpt_tf.analysis.lm_scorer import LMScorer
from gpt_tf.metrics import matthews
from gpt_tf.gpt1.backbone import token_inputs
from gpt_tf.gpt1.build import causal_lm_for
from gpt_tf.text.tokenizer import GPTTokenizer
from gpt_tf.data.task_rows import Example
from gpt_tf.data.winograd import read_dpr
from tests.small_runs import run_cli

DPR_SAMPLE = """The dog chased the cat because it barked loudly.
it
dog,cat
dog

The cat ran from the dog because it barked.
it
cat,dog
dog

The dog saw the cat with a ball and it barked at it.
it
cat,dog
Dog

"""


@pytest.fixture(scope="module")
def bpe(shared_data):
    return GPTTokenizer.from_dir(shared_data / "gpt1_bpe")


class PlantedLM:
    """Token inputs ``{"token_ids" [B, T], "padding_mask"}`` → logits ``[B, T, V]`` that are 0 except +10 on chosen
    next tokens: after ``trigger`` (bigram) or everywhere."""

    def __init__(self, vocab, boost_ids, trigger=None, n_ctx=64):
        self.vocab, self.boost, self.trigger = vocab, tf.constant(list(boost_ids)), trigger
        self.config = types.SimpleNamespace(n_ctx=n_ctx)

    def __call__(self, inputs, training=False):
        tokens = inputs["token_ids"]  # keras-hub's inputs, as GPT1CausalLM takes them
        boost = tf.reduce_sum(tf.one_hot(self.boost, self.vocab), axis=0) * 10.0  # [V]
        where = tf.ones_like(tokens, tf.float32) if self.trigger is None else tf.cast(tf.equal(tokens, self.trigger), tf.float32)
        return where[..., None] * boost


def _numpy_logprob(lm, tokens, scored):
    logits = np.asarray(lm(token_inputs(np.array([tokens[:-1]], np.int32))), np.float64)[0]
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    targets = np.array(tokens[1:])
    return float(logp[np.arange(len(targets)), targets][len(targets) - scored:].sum())


@pytest.mark.parametrize("preset", ["test", "lstm_test"])
@pytest.mark.parametrize("bos", [None, 7])
def test_scorer_equals_numpy_log_probs(preset, bos):
    keras.utils.set_random_seed(0)
    lm = causal_lm_for(get_size(preset))
    rng = np.random.default_rng(1)
    reqs = [(list(rng.integers(0, 1000, n)), list(rng.integers(0, 1000, m)))
            for n, m in [(0, 3), (5, 1), (12, 9), (0, 40), (30, 10), (3, 2), (60, 5)]]  # n_ctx = 32: some cut
    sums, counts = LMScorer(lm, bos_id=bos, batch_size=3).score(reqs)
    head = [] if bos is None else [bos]
    for (prefix, cont), got, count in zip(reqs, sums, counts):
        tokens = (head + prefix + cont)[-33:]
        expected_count = min(len(cont), len(tokens) - 1)
        assert count == expected_count
        np.testing.assert_allclose(got, _numpy_logprob(lm, tokens, expected_count), rtol=1e-5, atol=1e-4)


def test_scorer_rejects_unscorable_request():
    lm = PlantedLM(10, [1])
    with pytest.raises(ValueError, match="request 1: no continuation token"):
        LMScorer(lm).score([([1], [2]), ([], [3])])


def test_best_threshold_maximises_matthews():
    rng = np.random.default_rng(0)
    for _ in range(20):
        scores = np.round(rng.normal(size=40), 1)  # ties on purpose
        labels = (scores + rng.normal(size=40) > 0).astype(int)
        t = best_threshold(scores, labels)
        best = max(matthews(labels, (scores > c).astype(int)) for c in np.concatenate([scores, [scores.min() - 1]]))
        assert matthews(labels, (scores > t).astype(int)) == pytest.approx(best)


def test_normalised_is_zero_at_chance_and_one_at_reference():
    # (0.5 - 0.5) / 0.4 is exactly 0 in floating point, on every CPU
    assert normalised(0.5, 0.5, 0.9) == 0.0 and normalised(0.9, 0.5, 0.9) == pytest.approx(1.0)
    assert normalised(0.7, 0.5, None) is None


def test_sst2_compares_label_words_after_very(shared_data, bpe):
    config = ZeroShotConfig(tasks=("sst2",), data_dirs=(str(shared_data / "glue" / "SST-2"),), max_examples=24)
    suite = ZeroShotSuite(config, bpe)
    examples, reqs = suite.data["sst2"]["dev"]
    very = bpe.encode("very")
    assert len(reqs) == 2 * len(examples) == 48
    assert reqs[0][0][-len(very):] == very and reqs[0][1] == bpe.encode("negative") and reqs[1][1] == bpe.encode("positive")
    positive_share = np.mean([e.label == 1 for e in examples])
    for word, expected in (("positive", positive_share), ("negative", 1 - positive_share)):
        lm = PlantedLM(bpe.vocab_size, bpe.encode(word))
        (row,) = suite.evaluate(lm, step=3)
        assert row["score"] == pytest.approx(expected) and row["step"] == 3 and row["examples"] == 24


def _dpr_dir(tmp_path, text=DPR_SAMPLE):
    (tmp_path / "test.c.txt").write_text(text)
    return tmp_path


def test_dpr_reader_splits_at_the_first_pronoun(tmp_path):
    examples, skipped = read_dpr(_dpr_dir(tmp_path), "test")
    assert skipped == [] and [e.label for e in examples] == [0, 1, 1]
    assert examples[0] == Example("test-1", "The dog chased the cat because", "barked loudly.", ("dog", "cat"), 0)
    assert (examples[2].text_a, examples[2].text_b) == ("The dog saw the cat with a ball and", "barked at it.")


def test_dpr_reader_names_file_and_line_of_a_bad_example(tmp_path):
    path = _dpr_dir(tmp_path, DPR_SAMPLE + "A man saw a boy.\nhe\nman,boy\nman\n")
    with pytest.raises(ValueError, match=r"test\.c\.txt:16: pronoun 'he' does not occur"):
        read_dpr(path, "test")
    examples, skipped = read_dpr(path, "test", skip_malformed=True)
    assert len(examples) == 3 and skipped[0]["line"] == 16


def test_dprd_substitutes_each_referent_and_scores_the_rest(tmp_path, bpe):
    suite = ZeroShotSuite(ZeroShotConfig(tasks=("dprd",), data_dirs=(str(_dpr_dir(tmp_path)),)), bpe)
    examples, reqs = suite.data["dprd"]["test"]
    assert reqs[0] == (bpe.encode("The dog chased the cat because dog"), bpe.encode("barked loudly."))
    assert reqs[1] == (bpe.encode("The dog chased the cat because cat"), bpe.encode("barked loudly."))
    # A bigram LM for which "barked" follows "dog" (and nothing else stands out): the dog is chosen every time.
    lm = PlantedLM(bpe.vocab_size, bpe.encode("barked")[:1], trigger=bpe.encode("dog")[-1])
    assert suite.evaluate(lm)[0]["score"] == 1.0  # accuracies: counts over counts, exact at 0 and 1
    lm = PlantedLM(bpe.vocab_size, bpe.encode("barked")[:1], trigger=bpe.encode("cat")[-1])
    assert suite.evaluate(lm)[0]["score"] == 0.0


def _race_dir(tmp_path):
    article = " ".join(["the little town by the river had many old houses and a long bridge ."] * 12)
    record = {"article": article, "id": "m1.txt",
              "questions": ["what animal lived there ?", "who built the bridge ?"],
              "options": [["a zebra zebra", "a cat", "a dog", "a bird"], ["the mayor", "old men", "zebra zebra", "nobody"]],
              "answers": ["A", "C"]}
    folder = tmp_path / "RACE" / "dev" / "middle"
    folder.mkdir(parents=True)
    (folder / "1.txt").write_text(json.dumps(record))
    (tmp_path / "RACE" / "dev" / "high").mkdir()
    return tmp_path


def test_race_scores_each_answer_after_document_and_question(tmp_path, bpe):
    suite = ZeroShotSuite(ZeroShotConfig(tasks=("race",), data_dirs=(str(_race_dir(tmp_path)),)), bpe)
    examples, reqs = suite.data["race"]["dev"]
    question = bpe.encode("what animal lived there ?")
    assert len(reqs) == 8 and reqs[0][0][-len(question):] == question and reqs[2][1] == bpe.encode("a dog")
    lm = PlantedLM(bpe.vocab_size, bpe.encode("zebra"), n_ctx=32)  # the article is cut from the left to fit
    (row,) = suite.evaluate(lm)
    assert row["score"] == 1.0 and row["chance"] == 0.25 and row["examples"] == 2


def test_real_rows_through_the_suite_with_a_test_model(shared_data, bpe):
    glue, tasks = shared_data / "glue", ("cola", "sst2", "story_cloze")
    dirs = (str(glue / "CoLA"), str(glue / "SST-2"), str(shared_data / "story_cloze"))
    config = ZeroShotConfig(tasks=tasks, data_dirs=dirs, max_examples=12, reference={"sst2": 0.8})
    model_config = get_size("test", vocab_size=bpe.vocab_size, n_ctx=128)
    suite = ZeroShotSuite(config, bpe, bos_id=model_config.special_id("start"))
    keras.utils.set_random_seed(0)
    lm = causal_lm_for(model_config)
    rows = {r["task"]: r for r in suite.evaluate(lm, step=5)}
    assert set(rows) == set(tasks) and all(r["examples"] == 12 for r in rows.values())
    assert np.isfinite(rows["cola"]["threshold"]) and -1.0 <= rows["cola"]["score"] <= 1.0
    assert rows["sst2"]["normalized"] == pytest.approx((rows["sst2"]["score"] - 0.5) / 0.3)
    assert rows["story_cloze"]["split"] == "dev" and rows["story_cloze"]["normalized"] is None
    assert len(suite.data["story_cloze"]["val"][1]) == 24  # two endings per story
    assert len(suite.data["cola"]["train"][0]) == 12  # the threshold's split


def test_config_problems_are_reported_together(tmp_path):
    config = ZeroShotConfig(tasks=("cola", "squad"), data_dirs=(str(tmp_path / "missing"),), reference={"rte": 0.7})
    problems = "; ".join(config.problems())
    for needle in ("unknown zero-shot task 'squad'", "2 zero-shot task(s)", "does not exist", "['rte']"):
        assert needle in problems
    assert set(HEURISTICS) == {"cola", "sst2", "race", "story_cloze", "dprd"}


@pytest.fixture(scope="module")
def lm_data(shared_data, tmp_path_factory):
    from pipelines.pretrain_data import PretrainConfig, build_pretraining_data

    root = tmp_path_factory.mktemp("zs_books")
    index = [line.split("\t") for line in (shared_data / "books" / "index.tsv").read_text().splitlines()[1:]]
    for split in ("train", "valid"):
        (root / split).mkdir()
        book_id = min((int(r[4]), r[0]) for r in index if r[1] == split)[1]
        (root / split / f"{book_id}.txt").write_bytes((shared_data / "books" / split / f"{book_id}.txt").read_bytes())
    build_pretraining_data(PretrainConfig(input_dir=str(root / "train"), valid_dir=str(root / "valid"),
                                          output_dir=str(root / "data"), tokenizer_dir=str(shared_data / "gpt1_bpe"),
                                          n_ctx=32, show_progress=False))
    return root / "data"


def _csv_rows(path):
    return [{k: v for k, v in r.items() if k in ("step", "task", "score")} for r in csv.DictReader(open(path))]


def test_lstm_pretraining_with_periodic_zero_shot_equals_post_hoc(lm_data, shared_data, tmp_path):
    run_dir, tasks = tmp_path / "lstm", "sst2,story_cloze"
    dirs = f"{shared_data / 'glue' / 'SST-2'},{shared_data / 'story_cloze'}"
    run_cli("gpt_tf.train", "--model=lstm_test", f"--data_dir={lm_data}", f"--run_dir={run_dir}", "--batch_size=4",
            "--train_steps=4", "--warmup_steps=1", "--checkpoint_every=2", "--keep_checkpoints=5", "--log_every=2",
            "--eval_batches=1", "--sample_length=4", "--progress=false", f"--zero_shot_tasks={tasks}",
            f"--zero_shot_data_dirs={dirs}", "--zero_shot_every=2", "--zero_shot_max_examples=16")
    assert json.loads((run_dir / "model_config.json").read_text())["model_type"] == "lstm"
    periodic = _csv_rows(run_dir / "zero_shot.csv")
    assert [(r["step"], r["task"]) for r in periodic] == [(s, t) for s in ("2", "4") for t in tasks.split(",")]
    events = b"".join(p.read_bytes() for p in (run_dir / "tb").glob("events.out.tfevents.*"))
    assert b"zero_shot/story_cloze" in events
    out = tmp_path / "post_hoc.csv"
    run_cli("gpt_tf.analysis.zero_shot", f"--run_dir={run_dir}", f"--task={tasks}", f"--data_dir={dirs}", "--max_examples=16",
            f"--output_csv={out}")
    assert _csv_rows(out) == periodic


def test_cli_flag_errors_come_before_any_work(tmp_path):
    proc = run_cli("gpt_tf.analysis.zero_shot", f"--run_dir={tmp_path}", "--task=cola,foo", "--data_dir=x",
                   f"--output_csv={tmp_path / 'z.csv'}", check=False)
    assert proc.returncode != 0
    for needle in ("no model_config.json", "unknown zero-shot task 'foo'", "--output_csv must be outside"):
        assert needle in proc.stderr
