"""Preprocessors: raw strings → the model's features, by the paper's §3.3 input transformations.

``GPT1TaskPreprocessor`` tokenizes each text field (``GPT1Tokenizer``) and builds every example's
views with ``gpt_tf.data.transforms.transform_record``, the one definition the data pipelines and the
served SavedModels use (truncation rule included). As keras-hub's preprocessors, it takes one example
or a batch, eagerly or in ``tf.data`` (mapped before or after ``batch``), and pads every view to
``sequence_length``. With ``pad_to_bucket=True`` a batch (``ds.batch(n).map(preprocessor)``) is padded only to the
smallest length bucket (``gpt_tf.data.task_batches.bucket_lengths``: 8, 16, 24, 32, 48, …, ``sequence_length``) that
holds its longest view, so short texts do not pay for ``n_ctx`` of padding and Keras traces few shapes; it is off by
default, as keras-hub pads to one length: its ``fit`` / ``predict`` on texts in memory go through grain, whose
TensorFlow adapter fixes the batches' shape from the first ones (``gpt_tf/gpt1/batching.py`` orders and pads such
texts by bucket for ``fit``). The served SavedModels build their features here too
(``features``, padded to the batch's longest view). (``GPT1CausalLMPreprocessor``, the language model's, is
``gpt_tf/gpt1/causal_lm_preprocessor.py``.)
"""

from __future__ import annotations

import keras
import keras_hub
from gpt_tf.backend import tf  # imported at first use: the family imports without TensorFlow

from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.causal_lm_preprocessor import preset_length, sequence_length_of
from gpt_tf.gpt1.keras_hub_adapter import preprocessing_function
from gpt_tf.gpt1.tokenizer import GPT1Tokenizer
from gpt_tf.nn.layers import PACKAGE
from gpt_tf.tasks import INPUT_FIELDS, INPUT_TYPES
from gpt_tf.data.task_batches import bucket_lengths
from gpt_tf.data.transforms import transform_record
from gpt_tf.convert.hf import FROM_PRESET

CHOICES = "choices"
PADDINGS = ("length", "bucket", "longest")


def _as_fields(x, input_type: str) -> dict:
    """``x`` (strings, a tuple/list of per-field strings, or a dict by field name) → ``{field: tf.string}``."""
    names = INPUT_FIELDS[input_type] + ((CHOICES,) if input_type == "multiple_choice" else ())
    if isinstance(x, dict):
        missing = [n for n in names if n not in x]
        if missing:
            raise ValueError(f"{input_type} inputs need the fields {names}; missing {missing} (got {sorted(x)})")
        values = [x[n] for n in names]
    elif isinstance(x, (tuple, list)) and len(names) > 1:
        values = list(x)
    else:
        values = [x[0]] if isinstance(x, tuple) and len(x) == 1 else [x]
    if len(values) != len(names):
        raise ValueError(f"{input_type} inputs are {len(names)} field(s) {names} (a tuple or a dict), got "
                         f"{len(values)}")
    return {n: v if isinstance(v, tf.RaggedTensor) or getattr(v, "dtype", None) in (tf.int32, tf.int64)
            else tf.convert_to_tensor(v, tf.string) for n, v in zip(names, values)}


def pretokenize(x, tokenizer, input_type: str):
    """In-memory texts → token ids (ragged ``int32``) by the offline tokenizer, before ``tf.data``: the
    preprocessor then skips the in-graph tokenizer (same ids; its graph is slow to start per pass).
    A ``tf.data.Dataset`` or features are returned as they are."""
    if isinstance(x, tf.data.Dataset) or (isinstance(x, dict) and "input_ids" in x) or x is None:
        return x
    fields = _as_fields(x, input_type)
    out = {}
    for name, value in fields.items():
        if value.dtype != tf.string:
            out[name] = value
            continue
        ids = tokenizer.encode_eagerly(value)
        if value.shape.rank == 2:  # choices [B, K] -> [B, K, None]
            ids = tf.RaggedTensor.from_uniform_row_length(ids, value.shape[1])
        out[name] = ids
    return out


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1TaskPreprocessor(keras_hub.models.TextClassifierPreprocessor):
    """Texts → ``{"input_ids" [B, K, L], "extract_index" [B, K], "lm_weights" [B, K, L]}`` (§3.3), L =
    ``sequence_length``.

    Args:
        tokenizer: a ``GPT1Tokenizer``.
        sequence_length: ``n_ctx`` of the views (``from_preset``: the backbone's ``max_sequence_length`` unless
            given; a task sets it to its backbone's where it is None).
        input_type: ``"single"`` (``<s> a <e>``), ``"pair"`` (``<s> a $ b <e>``), ``"pair_symmetric"``
            (both orders) or ``"multiple_choice"`` (``<s> context $ choice_k <e>`` for each k).
        num_choices: candidates per example (multiple choice).
        pad_to_bucket: a batch is padded to the length bucket of its longest view (True) or to ``sequence_length``
            (False, the default: keras-hub's one length); one example is always padded to ``sequence_length``.

    Inputs: a batch of strings (single), a tuple ``(a, b)`` (pairs), ``(context, choices [B, K])``
    (multiple choice), or a dict by field name (``gpt_tf.tasks.INPUT_FIELDS`` and ``"choices"``).
    Called alone, a tuple is Keras's ``(x, y)``: give pairs as a dict. One example (each field a string,
    choices ``[K]``) gives features of one rank less (``input_ids`` ``[K, L]``), so
    ``ds.map(preprocessor).batch(n)`` works, as does mapping after ``batch``.

    Call arguments: ``x``, ``y``, ``sample_weight`` (returned as given).

    Example:

    ```python
    import gpt_tf, tensorflow as tf
    pre = gpt_tf.GPT1TaskPreprocessor.from_preset("gpt1_tiny_books_en", sequence_length=64, input_type="pair")
    features = pre({"premise": ["a man sleeps ."], "hypothesis": ["a person rests ."]})
    features["input_ids"]                          # [1, 1, 64]: <s> premise $ hypothesis <e>, padded
    pre("a man sleeps .")["input_ids"]             # one example: [1, 64], padded to sequence_length
    single = gpt_tf.GPT1TaskPreprocessor.from_preset("gpt1_tiny_books_en")      # sequence_length 128
    ds = tf.data.Dataset.from_tensor_slices((["a gem", "a dull , tired mess"], [1, 0])).map(single).batch(2)
    ```
    """

    backbone_cls = GPT1Backbone
    tokenizer_cls = GPT1Tokenizer
    from_preset = FROM_PRESET  # keras-hub's, and a transformers GPT-1 checkpoint too (gpt_tf/convert/hf.py)

    def __init__(self, tokenizer, sequence_length=None, input_type="single", num_choices=0, pad_to_bucket=False,
                 **kwargs):
        keras_hub.models.Preprocessor.__init__(self, **kwargs)  # no BERT-style packer: transforms.py packs
        self.packer = None
        if input_type not in INPUT_TYPES:
            raise ValueError(f"input_type must be one of {INPUT_TYPES}, got {input_type!r}")
        if input_type == "multiple_choice" and num_choices < 2:
            raise ValueError(f"multiple_choice needs num_choices >= 2, got {num_choices}")
        self.tokenizer = tokenizer
        self.sequence_length = sequence_length
        self.input_type = input_type
        self.num_choices = int(num_choices)
        self.pad_to_bucket = bool(pad_to_bucket)
        self.truncate = "transforms.py"

    @classmethod
    def _add_missing_kwargs(cls, loader, kwargs):
        return preset_length(loader, super()._add_missing_kwargs(loader, kwargs))

    def build(self, input_shape=None):
        self.built = True  # no packer: transforms.py packs the views

    @property
    def views(self) -> int:
        return {"pair_symmetric": 2, "multiple_choice": self.num_choices}.get(self.input_type, 1)

    def _task(self):
        from gpt_tf.tasks import TaskSpec  # pylint: disable=import-outside-toplevel
        head = "choice" if self.input_type == "multiple_choice" else "classification"
        labels = tuple(str(i) for i in range(max(self.num_choices, 2)))
        return TaskSpec("keras", self.input_type, head, labels, ("accuracy",), num_choices=self.num_choices)

    @preprocessing_function
    def call(self, x, y=None, sample_weight=None):
        """``(features, y, sample_weight)``; features given (a dict with ``input_ids``) pass through."""
        sequence_length_of(self)
        if isinstance(x, dict) and "input_ids" in x:  # already the model's features: passed through
            return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        features = self.features(_as_fields(x, self.input_type), "bucket" if self.pad_to_bucket else "length")
        return keras.utils.pack_x_y_sample_weight(features, y, sample_weight)

    def features(self, fields: dict, padding: str = "length") -> dict:
        """``{field: tf.string [B]}`` (choices ``[B, K]``; or their token ids, ragged), or one example's (``[]``,
        choices ``[K]``) → the model's features. A batch is padded to ``padding``: ``"length"`` (``sequence_length``),
        ``"bucket"`` (the bucket of its longest view) or ``"longest"`` (its longest view: the served models); one
        example always to ``sequence_length``."""
        if padding not in PADDINGS:
            raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
        n_ctx, special, task = sequence_length_of(self), self.tokenizer.special_ids(), self._task()
        first = fields[next(iter(fields))]
        scalar = first.dtype == tf.string and first.shape.rank == 0
        if scalar:
            fields = {k: v[tf.newaxis] for k, v in fields.items()}
        tokens = self._tokens(fields)
        names, empty = INPUT_FIELDS[self.input_type], tf.zeros([0], tf.int32)

        def one(i):
            record = {"tokens_a": tokens[names[0]][i], "tokens_b": tokens[names[1]][i] if len(names) > 1 else empty,
                      "choice_tokens": empty, "choice_lengths": empty, "label": tf.constant(-1.0)}
            if self.input_type == "multiple_choice":
                rows = tokens[CHOICES][i * self.num_choices:(i + 1) * self.num_choices]
                record.update(choice_tokens=rows.flat_values, choice_lengths=tf.cast(rows.row_lengths(), tf.int32))
            out, _ = transform_record(task, record, n_ctx, special)
            return out["input_ids"], out["extract_index"], out["lm_weights"]

        k = self.views
        spec = (tf.TensorSpec([k, n_ctx], tf.int32), tf.TensorSpec([k], tf.int32),
                tf.TensorSpec([k, n_ctx], tf.float32))
        batch = tf.shape(tokens[names[0]].row_lengths())[0]
        ids, extract, weights = tf.map_fn(one, tf.range(batch), fn_output_signature=spec)
        if not scalar and padding != "length":  # one length for the whole batch
            length = tf.reduce_max(extract) + 1
            if padding == "bucket":
                buckets = tf.constant(bucket_lengths(n_ctx), tf.int32)
                length = tf.gather(buckets, tf.searchsorted(buckets, length[tf.newaxis])[0])
            ids, weights = ids[:, :, :length], weights[:, :, :length]
        out = {"input_ids": ids, "extract_index": extract, "lm_weights": weights}
        return {k: v[0] for k, v in out.items()} if scalar else out

    def _tokens(self, fields: dict) -> dict:
        """Each field's token ids, ragged ``[N, None]`` (choices flattened): texts tokenized, in a graph all of them in
        one tokenizer call (a pair's or a choice's texts side by side, each text's ids its own), so the graph holds
        the tokenizer once; ids given as they are (``_ids``)."""
        texts = [k for k, v in fields.items() if v.dtype == tf.string]
        if tf.executing_eagerly():  # called alone (not from `call`), `tokenize` would give Python lists
            tokens = {k: self.tokenizer.encode_eagerly(fields[k]) for k in texts}
        elif texts:
            flat = [tf.reshape(fields[k], [-1]) for k in texts]
            ids = self.tokenizer.tokenize(tf.concat(flat, axis=0))
            ends = tf.cumsum([tf.size(v) for v in flat])
            starts = tf.concat([[0], ends[:-1]], axis=0)
            tokens = {k: ids[starts[i]:ends[i]] for i, k in enumerate(texts)}
        else:
            tokens = {}
        return {k: tokens[k] if k in tokens else self._ids(v) for k, v in fields.items()}

    @staticmethod
    def _ids(value):
        """Token ids given for a field, as ragged ``int32`` ``[N, None]`` (choices flattened)."""
        if not isinstance(value, tf.RaggedTensor):
            value = tf.RaggedTensor.from_tensor(value)
        value = tf.cast(value, tf.int32)
        return value.merge_dims(0, 1) if value.ragged_rank == 2 or len(value.shape) == 3 else value

    def get_config(self):
        config = keras_hub.models.Preprocessor.get_config(self)
        config.update(sequence_length=self.sequence_length, input_type=self.input_type, num_choices=self.num_choices,
                      pad_to_bucket=self.pad_to_bucket)
        return config
