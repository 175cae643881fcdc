"""GPT-1 tokenizer: offline vs the reference bpe(), in-graph vs offline, training, export."""

import collections
import json
import os
import random
import re
import subprocess
import sys
import textwrap

import ftfy
import pytest
import tensorflow as tf

from bench.tokenizer import ReferenceEncoder, fidelity_sets, score
from gpt_tf.text import make_spacy_rules as spacy_rules
from gpt_tf.text import text_clean
from gpt_tf.text.tokenizer import GPTTokenizer
from tests.small_runs import CHILD_SITE

BOOKS = ("b0000", "b0012", "b0049", "b0053", "b0098")  # curly quotes, accents, ʼ ʻ –, HTML entities
EDGE_CASES = [
    "", " ", "   \t  ", "\n", "\n\n\n", "\r\n", "a\rb", "tab\there\tand\tthere", "line one\nline two\r\n\r\nline three",
    "café naïve Zoë Ångström façade", "“Curly” ‘quotes’ „low“ «guillemets»", "it’s don’t I’m we’ve",
    "em—dash en–dash bar―dash", "ellipsis… and... more....", "!!! ?!? ... --- ~~~ *** ___ ((())) [[]] {{}} ||",
    "1,234.56 2018 3.14 $5 €10 50% #1 @home a+b=c 1/2 ½ ²", "😀 emoji 🎉 x😀y ♥ ★ → ∞ © ™ °C",
    "ﬁne ﬂuﬃest ＬＯＵＤ　ＮＯＩＳＥＳ ｶﾀｶﾅ", "e\u0301 decomposed cafe\u0301", "İstanbul ΟΔΟΣ ΣΑΣ. Straße ǅ",
    "&amp; &lt;b&gt; &rsquo;tis &#8217; &#x2019; &#59; &#128; &#xD800; &#99999999; &c; &EACUTE;",
    "x<y &amp; z\nsecond &amp; line", "\x1b[31mred\x1b[0m \x00nul\x07bell\x7f \ufeffbom \u200bzero-width",
    "\x93cp1252 quotes\x94 \x85", "a\u2028b\u2029c\x85d", "中文 日本語 한국어 العربية עברית", "aaaa aaaaa aaaaaaa",
    "CamelCase UPPER lower MiXeD", "e-mail@example.com https://example.com/a?b=c", "\\back\\slash /fwd/ `tick` ^caret",
]


def read_book(path):
    """A book's text without the Project Gutenberg header and licence (UTF-8, else Latin-1)."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    start = re.search(r"\*\*\* ?START OF.*", text)
    end = re.search(r"\*\*\* ?END OF", text)
    return text[start.end() if start else 0: end.start() if end else len(text)]


def glue_sentences(glue, per_task=300):
    """Sentences of SST-2, CoLA, MRPC and RTE train sets (first ``per_task`` rows each)."""
    layout = {"SST-2": (True, [0]), "CoLA": (False, [3]), "MRPC": (True, [3, 4]), "RTE": (True, [1, 2])}
    sentences = []
    for task, (header, columns) in layout.items():
        rows = (glue / task / "train.tsv").read_text(encoding="utf-8").split("\n")[int(header):]
        for row in rows[:per_task]:
            fields = row.split("\t")
            sentences.extend(fields[c] for c in columns if c < len(fields))
    return sentences


@pytest.fixture(scope="module")
def gpt1(shared_data):
    """GPT-1's released tokenizer (offline)."""
    return GPTTokenizer.from_dir(shared_data / "gpt1_bpe")


@pytest.fixture(scope="module")
def gpt1_tf(gpt1):
    """GPT-1's in-graph tokenizer."""
    return gpt1.tf_tokenizer()


@pytest.fixture(scope="module")
def reference(shared_data):
    """GPT-1's released encoder with spaCy's English tokenizer (spaCy: requirements-dev.txt)."""
    try:
        import spacy  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("spaCy is required when CI=true (requirements-dev.txt)")
        pytest.skip("spaCy is not installed (requirements-dev.txt)")
    return ReferenceEncoder(shared_data / "gpt1_bpe")


@pytest.fixture(scope="module")
def books(shared_data):
    """Text of a few training books."""
    return [read_book(shared_data / "books" / "train" / f"{b}.txt") for b in BOOKS]


@pytest.fixture(scope="module")
def corpus(books, shared_data):
    """Thousands of real lines (books + GLUE) plus hand-written edge cases."""
    lines = []
    for book in books:
        lines += [line for line in book.split("\n") if line.strip()][:450]
    lines += glue_sentences(shared_data / "glue")
    paragraphs = ["\n".join(book.split("\n")[100 + i: 110 + i]) for book in books for i in range(0, 200, 10)]
    return lines + paragraphs + EDGE_CASES


def run_graph(tf_tok, texts, batch=64):
    """Graph ids of ``texts`` as lists, batch by batch."""
    out = []
    for i in range(0, len(texts), batch):
        out += tf_tok(tf.constant(texts[i: i + batch], tf.string)).to_list()
    return out


def test_text_standardize_is_the_reference(corpus):
    """The shared-pattern text_standardize equals the verbatim GPT-1 function."""
    def reference(text):
        text = text.replace("—", "-").replace("–", "-").replace("―", "-").replace("…", "...").replace("´", "'")
        text = re.sub(r'''(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\\+|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)''', r" \1 ", text)
        text = re.sub(r"\s*\n\s*", " \n ", text)
        text = re.sub(r"[^\S\n]+", " ", text)
        return text.strip()
    every_space = "".join(chr(c) for c in range(0x110000) if chr(c).isspace())
    assert set(every_space) == set(text_clean.WHITESPACE_CHARS)
    runs = "".join(c * n for n in (1, 2, 3) for c in text_clean.STANDARDIZE_RUN_CHARS + ".:'=")
    for text in corpus + [f"a{every_space}b{every_space}", runs, f"x{runs}y{runs[::-1]}"]:
        assert text_clean.text_standardize(text) == reference(text), repr(text)


def test_fix_text_fast_path_is_ftfy(corpus, books):
    """Skipping ftfy on safe ASCII lines gives ftfy's result: lines, mixed texts, books."""
    cases = ["a\r\nb\rc", "AT&amp;T", "x\x1b[1my", "nul\x00", "form\x0cfeed", "<b>&lt;</b>", "plain",
             "a &amp; b\r\n<x> &amp;\n&amp; “c”", "é &amp;\nplain <\n&amp;", "\n\n&lt;\n", "a\rb &amp;\r<"]
    for text in corpus + cases + books[-2:]:
        assert text_clean.fix_text(text) == ftfy.fix_text(text), repr(text[:200])


def test_offline_matches_reference_bpe(gpt1, reference, books):
    """HF BPE on GPT-1's files == the release's bpe() (bench/tokenizer.py), word by word, incl. <unk> chars."""
    counts = collections.Counter(w for book in books for w in gpt1.words(book[:60000]))
    words = [w for w, _ in counts.most_common(250)] + sorted(counts)[::20]
    words += ["aaaa", "aaaaaaa", "zzzzzz", "x😀", "😀y", "ab😀cd", "\n", "naïve", "anticonstitutionnellement"]
    assert len(words) > 400
    for word in words:
        expected = [gpt1.encoder.get(t, 0) for t in reference.bpe(word).split(" ")]
        assert gpt1.word_ids(word) == expected, word


def test_offline_encode_conventions(gpt1):
    """spaCy's words lower-cased, newline token, <unk>, decode skipping special ids."""
    assert gpt1.vocab_size == 40478 and gpt1.unk_id == 0
    assert gpt1.words("Don't STOP...\n\nNow, “go”!") == ["do", "n't", "stop", "...", "\n", "now", ",", '"', "go",
                                                            '"', "!"]
    assert gpt1.words("I can't believe it's Mr. Smith's U.S. trip -- 3.14 km, won't you?!") == [
        "i", "ca", "n't", "believe", "it", "'s", "mr.", "smith", "'s", "u.s.", "trip", "--", "3.14", "km", ",",
        "wo", "n't", "you", "?", "!"]
    assert gpt1.words("mr. u.s. MR. e-mail@example.com www.Example.com 5km 2^3 end.Next") == [
        "mr", ".", "u.s", ".", "mr", ".", "e", "-", "mail@example.com", "www.example.com", "5", "km", "2", "^",
        "3", "end", ".", "next"]
    ids = gpt1.encode("Hello world.\nBye 😀")
    assert ids[3] == gpt1.encoder["\n</w>"] == 40477 and ids[-1] == 0
    assert gpt1.encode_batch(["Hello world.", "", "Bye"]) == [gpt1.encode(t) for t in ["Hello world.", "", "Bye"]]
    assert gpt1.decode(gpt1.encode("The cat sat.") + [40478, 40481]) == "the cat sat ."


def test_word_split_is_spacys(gpt1, reference, corpus):
    """The words are spaCy's (as GPT-1's encoder used it) on thousands of real texts and edge cases."""
    bad = []
    for text in corpus:
        expected = [w.strip(" ") if w.isspace() else w for w in reference.words(text)]  # '\n ' -> '\n'
        if gpt1.words(text) != expected:
            bad.append((text, expected, gpt1.words(text)))
    assert not bad, bad[:3]


def test_spacy_rules_file_is_current(reference):  # pylint: disable=unused-argument  (needs spaCy)
    """gpt_tf/text/spacy_en_rules.json is what gpt_tf/text/make_spacy_rules.py exports from the installed spaCy."""
    assert json.loads(spacy_rules.OUTPUT.read_text(encoding="utf-8")) == spacy_rules.export()


def test_fidelity_on_real_sentences(gpt1, gpt1_tf, reference, shared_data):
    """Pins the fidelity bench on its first 60 texts of every set: ids identical to the release's."""
    texts = [t for name, ts in fidelity_sets(shared_data).items() for t in ts[:60]]
    ours = gpt1.encode_batch(texts)
    result = score([reference.encode(t) for t in texts], ours)
    assert result["texts"] == 360 and result["identical"] == 360 and result["edits"] == 0, result
    assert run_graph(gpt1_tf, texts) == ours


def test_graph_matches_offline_on_real_text(gpt1, gpt1_tf, corpus):
    """In-graph ids == offline ids on thousands of lines, paragraphs and edge cases."""
    assert len(corpus) > 2500
    offline = gpt1.encode_batch(corpus)
    graph = run_graph(gpt1_tf, corpus)
    mismatches = [(t, o, g) for t, o, g in zip(corpus, offline, graph) if o != g]
    assert not mismatches, mismatches[:3]
    assert all(isinstance(i, int) for row in graph for i in row)


def test_graph_repairs_mojibake_as_ftfy(gpt1_tf, shared_data):
    """ftfy's fix_encoding in the graph: real sentences made mojibake (UTF-8 read as Latin-1,
    Windows-1252/1251/1250, MacRoman, cp437), twice, inside clean text, with A0 lost, beside
    clean lines; the graph's cleanup equals text_clean.clean_text (ftfy) on every one."""
    rng = random.Random(0)
    sentences = [s for s in glue_sentences(shared_data / "glue", per_task=3000) if not s.isascii()]
    sentences += ["Iraq’s café — naïve “quoted” 50€ Ñandú ½ ™ …", "Привет мир — да", "Straße – Größe x\u00a0y"]
    texts = []
    for _ in range(240):  # 1,200 texts
        text, encoding = rng.choice(sentences), rng.choice(["latin-1", "cp1252", "cp1251", "cp1250", "mac_roman",
                                                            "cp437"])
        mojibake = text.encode("utf-8").decode(encoding, errors="replace")
        words = text.split(" ")
        words[0] = words[0].encode("utf-8").decode(encoding, errors="replace")
        texts += [mojibake, mojibake.encode("utf-8").decode("cp1252", errors="replace"), " ".join(words),
                  mojibake.replace("\u00a0", " "), f"{text}\n{mojibake}"]
    assert sum(t != text_clean.fix_text(t) for t in texts) > 600  # ftfy repairs most of them
    clean = tf.function(gpt1_tf.clean, autograph=False)  # in a graph, as serving runs it (eager: ~15 ms a text)
    graph = [t.decode("utf-8") for i in range(0, len(texts), 100) for t in clean(tf.constant(texts[i: i + 100])).numpy()]
    bad = [(t, g) for t, g in zip(texts, graph) if g != text_clean.clean_text(t)]
    assert not bad, bad[:3]


def test_graph_shapes_and_edge_batches(gpt1, gpt1_tf):
    """Batch of 0, batch of empty strings, int32 ragged output, use inside tf.function."""
    empty = gpt1_tf(tf.constant([], tf.string))
    assert empty.shape[0] == 0 and empty.dtype == tf.int32
    assert gpt1_tf(tf.constant(["", " ", "\n"])).to_list() == [[], [], []]

    @tf.function
    def lengths(texts):
        return gpt1_tf(texts).row_lengths()

    texts = ["one two three", "", "four"]
    assert lengths(tf.constant(texts)).numpy().tolist() == [len(gpt1.encode(t)) for t in texts]


def test_graph_merge_loop_matches_offline(gpt1, gpt1_tf, books):
    """The while-loop BPE alone (no whole-word table) on thousands of words."""
    words = sorted({w for book in books for w in gpt1.words(book[:40000])})
    words += [t[:-4] for t in list(gpt1.encoder)[::25] if t.endswith("</w>") and len(t) > 4]
    merged = gpt1_tf._merge(tf.constant(words)).to_list()  # pylint: disable=protected-access
    assert merged == [gpt1.word_ids(w) for w in words]


def test_train_save_load_roundtrip(books, tmp_path):
    """train() writes GPT-1's two-file format; reload, encode/decode and graph agree."""
    out = tmp_path / "bpe"
    tok = GPTTokenizer.train(books[:2], vocab_size=2000, out_dir=str(out), show_progress=False)
    assert sorted(os.listdir(out)) == ["encoder.json", "vocab.bpe"]
    encoder = json.loads((out / "encoder.json").read_text(encoding="utf-8"))
    merges = (out / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    assert merges[0] == "#version: 0.2" and merges[-1] == ""
    assert all(len(m.split(" ")) == 2 for m in merges[1:-1])
    assert encoder["<unk>"] == 0 and sorted(encoder.values()) == list(range(len(encoder)))
    assert 1900 <= tok.vocab_size <= 2100 and "\n</w>" in encoder
    assert "n't</w>" in encoder and "'s</w>" in encoder  # learnt on spaCy's words, as GPT-1's vocabulary
    again = GPTTokenizer.from_dir(out)
    sample = [line for line in books[0].split("\n") if line.strip()][50:150]
    assert again.encode_batch(sample) == tok.encode_batch(sample)
    for text in sample:
        ids = tok.encode(text)
        assert 0 not in ids
        assert tok.decode(ids) == " ".join(tok.words(text))
    tok.save(str(tmp_path / "copy"))
    assert (tmp_path / "copy" / "vocab.bpe").read_bytes() == (out / "vocab.bpe").read_bytes()
    assert run_graph(tok.tf_tokenizer(), sample[:40]) == tok.encode_batch(sample[:40])


def test_training_is_deterministic(tmp_path):
    """The same texts give the same two files, run after run. Words of a small alphabet make many pairs of
    equal counts, whose order HF's trainer broke by ids it gave in a hash map's order (6 different
    vocabularies in 6 runs before the fix)."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 6))) for _ in range(300)]
    texts = [" ".join(rng.choice(words) for _ in range(50)) + " ." for _ in range(40)]
    files = set()
    for run in range(4):
        out = tmp_path / str(run)
        GPTTokenizer.train(texts, vocab_size=200, out_dir=str(out), show_progress=False)
        files.add(((out / "encoder.json").read_bytes(), (out / "vocab.bpe").read_bytes()))
    assert len(files) == 1


def test_training_reads_the_texts_once_and_learns_what_hf_learns_on_them_whole(books, tmp_path):
    """``train`` counts the words of each text as it reads it (the texts are a generator, read once) and hands HF
    the counts: the files equal HF's trainer given the whole prepared texts, as ``train`` did when it held them."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    from gpt_tf.text.tokenizer import END_OF_WORD, UNK, pre_tokenizer
    from gpt_tf.text.word_split import WordSplitter

    texts = [book[:150_000] for book in books[:3]]
    ours = GPTTokenizer.train((t for t in texts), vocab_size=1500, out_dir=str(tmp_path / "ours"), show_progress=False)
    prepared = [WordSplitter()(text_clean.clean_text(t)) for t in texts]
    ends = sorted({word[-1] for text in prepared for word in text.split(" ") if word})
    hf = Tokenizer(BPE(unk_token=UNK, end_of_word_suffix=END_OF_WORD))
    hf.pre_tokenizer = pre_tokenizer()
    hf.train_from_iterator(prepared, BpeTrainer(vocab_size=1500, special_tokens=[UNK] + [e + END_OF_WORD for e in ends],
                                                end_of_word_suffix=END_OF_WORD, show_progress=False))
    model = json.loads(hf.to_str())["model"]
    whole = GPTTokenizer(model["vocab"], [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]])
    whole.save(str(tmp_path / "whole"))
    for name in ("encoder.json", "vocab.bpe"):
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert ours.vocab_size == 1500


def test_saved_model_runs_with_tensorflow_only(gpt1, gpt1_tf, tmp_path):
    """Export in a tf.Module, reload in a fresh process that imports only tensorflow."""
    class Exported(tf.Module):
        def __init__(self, tokenizer):
            super().__init__()
            self.tokenizer = tokenizer

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, texts):
            ids = self.tokenizer(texts)
            return {"ids": ids.to_tensor(default_value=-1), "lengths": ids.row_lengths()}

    module = Exported(gpt1_tf)
    tf.saved_model.save(module, str(tmp_path / "model"), signatures={"serving_default": module.serve})
    texts = ["Hello, “world”…", "", "Ligature ﬁ &amp; naïve 😀\nnew line"]
    script = textwrap.dedent("""
        import json, sys
        import tensorflow as tf
        model = tf.saved_model.load(sys.argv[1])
        texts = tf.constant(json.loads(sys.argv[2]))
        ragged = model.tokenizer(texts).to_list()
        served = model.signatures["serving_default"](texts=texts)
        dense = [row[:n] for row, n in zip(served["ids"].numpy().tolist(), served["lengths"].numpy())]
        ours = sorted(m for m in sys.modules if m.split(".")[0] in ("gpt_tf", "tensorflow_text", "keras_hub"))
        print(json.dumps({"ragged": ragged, "dense": dense, "modules": ours}))
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=CHILD_SITE)  # no project code on the path
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "model"), json.dumps(texts)],
                            capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().split("\n")[-1])
    expected = [gpt1.encode(t) for t in texts]
    assert got["ragged"] == expected and got["dense"] == expected and got["modules"] == []


def test_load_errors_name_the_path(gpt1, tmp_path):
    """Missing files, zero or two candidate files, bad merges line: clear errors."""
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        GPTTokenizer.from_files(missing, gpt1.merges_path)
    with pytest.raises(FileNotFoundError, match="nothing_here"):
        GPTTokenizer.from_dir(tmp_path / "nothing_here")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=f"{re.escape(str(empty))}.*one .json.*none"):
        GPTTokenizer.from_dir(empty)
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.json", "b.json"):
        (two / name).write_text("{}")
    (two / "vocab.bpe").write_text("#version: 0.2\n")
    with pytest.raises(FileNotFoundError, match=f"{re.escape(str(two))}.*a.json, b.json"):
        GPTTokenizer.from_dir(two)
    bad = tmp_path / "bad.bpe"
    bad.write_text("#version: 0.2\nt h\nthis is wrong\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{re.escape(str(bad))}:3"):
        GPTTokenizer.from_files(gpt1.encoder_path, bad)
    no_unk = tmp_path / "no_unk.json"
    no_unk.write_text(json.dumps({"a": 0, "b": 1}), encoding="utf-8")
    with pytest.raises(ValueError, match="no '<unk>'"):
        GPTTokenizer.from_files(no_unk, bad)


def test_random_unicode_graph_matches_offline(gpt1, gpt1_tf):
    """Random mixes of ASCII, Latin-1, punctuation, symbols, spaces and marks agree."""
    rng = random.Random(0)
    alphabet = ("abcXYZ019 .,;:'\"!?-()&#<>\n\t\r" + "éèüßñçÉÀ" + "“”‘’—–…´«»" + "ﬁﬂＡｂ１　"
                + "\u0301\u0308\u00a0\u2028\x85\x93\x1b" + "😀€°½²ΣσΟ" + "ÃÂâ€™©\x80\x99ÐÑ")
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(1500)]
    texts += ["&amp;" + t for t in texts[:50]] + ["x&#" + str(rng.randint(0, 70000)) + ";y" for _ in range(50)]
    offline = gpt1.encode_batch(texts)
    graph = run_graph(gpt1_tf, texts)
    bad = [(t, o, g) for t, o, g in zip(texts, offline, graph) if o != g]
    assert not bad, bad[:3]


def test_graph_cleanup_per_character(gpt1_tf):
    """Graph cleanup and lower-casing == Python's for each character between letters: all of
    U+0000-U+2FFF, every character the graph maps or lower-cases, and a sample beyond."""
    codes = set(range(0x3000)) | set(range(0x3000, 0x30000, 7))
    codes |= {ord(c) for c in text_clean.graph_char_map()}
    codes |= {c for c in range(0x30000) if chr(c).lower() != chr(c)}
    texts = [f"x{chr(c)}Y" for c in sorted(codes) if not 0xD800 <= c <= 0xDFFF]
    cleaned = [t.decode("utf-8") for t in gpt1_tf.clean(tf.constant(texts)).numpy()]
    bad = [(t, g) for t, g in zip(texts, cleaned) if g != text_clean.clean_text(t)]
    assert not bad, bad[:5]
    texts.remove("x\x00Y")  # ICU stops at NUL; lower() only sees cleaned text, which has none
    lowered = [t.decode("utf-8") for t in gpt1_tf.lower(tf.constant(texts)).numpy()]
    bad = [(t, g) for t, g in zip(texts, lowered) if g != t.lower()]
    assert not bad, bad[:5]
