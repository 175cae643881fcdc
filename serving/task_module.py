"""A fine-tuned task model as a ``tf.Module`` whose signatures stock TF Serving can run.

Every signature is core TensorFlow (``gpt_tf.text.tf_tokenizer`` for the text, the features of the task's
``GPT1TaskPreprocessor`` -- the §3.3 transformation of ``gpt_tf.data.transforms.transform_record``, the very
function training uses -- and the model's functional graph traced into plain ops), so the SavedModel loads in a
process that imports only ``tensorflow``.

Signatures (inputs -> outputs; B = any batch size >= 1, K = views per example):

* ``serving_default``: one ``tf.string [B]`` tensor per input field (``TaskSpec.input_fields``; multiple
  choice adds ``choices`` ``[B, num_choices]``) -> classification and choice heads:
  ``probabilities`` float32 ``[B, C]``, ``label_ids`` int64 ``[B]``, ``label_names`` string
  ``[B]``, ``classes`` string ``[B, C]`` (the label of each column); regression: ``score``
  float32 ``[B]``.
* ``tokens``: the model's own features, ``input_ids`` int32 ``[B, K, T]`` (T <= n_ctx, padded
  after the extract token) and ``extract_index`` int32 ``[B, K]`` -> the same outputs.
* ``features``: the text fields -> the ``input_ids`` / ``extract_index`` the model sees (for
  checking the in-graph preprocessing against ``pipelines.finetune_data``).
* ``classify`` (classification and choice heads) / ``regress`` (regression): TF Serving's
  Classify / Regress APIs, serialized ``tf.Example`` ``inputs`` (one bytes feature per field;
  ``choices`` holds num_choices values) -> ``classes`` + ``scores`` ``[B, C]`` / ``outputs``
  ``[B]``. Their SignatureDefs carry the classify / regress method names (see
  ``serving/export.py``).

Text is cleaned and tokenized as offline (limits in ``gpt_tf/text/tf_tokenizer.py``), then each
example goes through ``transform_record``: its truncation rule (module doc of
``gpt_tf/data/transforms.py``) applies to inputs longer than the context. Views are padded to
the batch's longest view rather than to n_ctx; attention is causal, so the extract-token state
is the same. Requests are rejected (``InvalidArgumentError``, i.e. INVALID_ARGUMENT) when the
batch is empty, a text is not valid UTF-8 or encodes to no token (the offline pipeline refuses
those examples too), or token ids are out of range.
"""

from __future__ import annotations

import tensorflow as tf

from gpt_tf.tasks import TaskSpec

CHOICES = "choices"  # the candidates' signature input (multiple choice)


def input_specs(task: TaskSpec) -> dict:
    """``{field: TensorSpec}`` of the text signatures of ``task``."""
    specs = {name: tf.TensorSpec([None], tf.string, name=name) for name in task.input_fields}
    if task.input_type == "multiple_choice":
        specs[CHOICES] = tf.TensorSpec([None, task.num_choices], tf.string, name=CHOICES)
    return specs


def check_texts(name: str, texts: tf.Tensor) -> list:
    """Assertions that ``texts`` (any shape) are valid UTF-8; the message names the field."""
    flat = tf.reshape(texts, [-1])
    repaired = tf.strings.unicode_transcode(flat, "UTF-8", "UTF-8", errors="replace")
    return [tf.debugging.assert_equal(
        tf.reduce_all(tf.equal(repaired, flat)), True,
        message=f"input '{name}': a string is not valid UTF-8")]


def check_batch(fields: dict) -> list:
    """Assertions: at least one example, and every field has the same batch size."""
    sizes = [tf.shape(t)[0] for t in fields.values()]
    checks = [tf.debugging.assert_positive(sizes[0], message="empty batch: send at least one example")]
    checks += [tf.debugging.assert_equal(size, sizes[0], message=f"inputs {sorted(fields)} differ in batch size")
               for size in sizes[1:]]
    return checks


def check_tokens(name: str, ids: tf.RaggedTensor) -> list:
    """Assertion: no text of field ``name`` encodes to zero tokens."""
    return [tf.debugging.assert_positive(ids.row_lengths(), message=f"input '{name}': a text encodes to no token")]


class TaskServingModule(tf.Module):
    """``model`` (a keras-hub task of the family: ``gpt_tf/gpt1/text_classifier.py``) behind text-in signatures, its
    features made by ``preprocessor`` (a ``GPT1TaskPreprocessor``); see the module doc."""

    def __init__(self, model, task: TaskSpec, preprocessor, name=None):
        super().__init__(name=name)
        self.model, self.task, self.preprocessor = model, task, preprocessor
        # tracked here: the in-graph tokenizer's lookup tables (the Keras tokenizer keeps it untracked) are saved with
        # the module, which its signatures capture
        self.tokenizer = preprocessor.tokenizer.tf_tokenizer
        backbone = model.backbone
        if preprocessor.tokenizer.vocabulary_size() != backbone.vocabulary_size:
            raise ValueError(f"the tokenizer has {preprocessor.tokenizer.vocabulary_size()} ids (BPE + specials) but "
                             f"the model {backbone.vocabulary_size}")
        self.n_ctx, self.total_vocab = backbone.max_sequence_length, backbone.vocabulary_size
        self.views = task.num_views

    # ---------------------------------------------------------------- graph pieces
    def _token_fields(self, fields: dict) -> dict:
        """Validated text fields -> ragged token ids per field (choices flattened to rows)."""
        checks = check_batch(fields)
        for name, texts in fields.items():
            checks += check_texts(name, texts)
        with tf.control_dependencies(checks):
            tokenize = self.preprocessor.tokenizer.tokenize
            tokens = {name: tokenize(tf.reshape(texts, [-1])) for name, texts in fields.items()}
        checks = [c for name, ids in tokens.items() for c in check_tokens(name, ids)]
        with tf.control_dependencies(checks):
            return {name: tf.identity(ids) for name, ids in tokens.items()}

    def features(self, fields: dict) -> tuple[tf.Tensor, tf.Tensor]:
        """Text fields -> (``input_ids`` int32 ``[B, K, T]``, ``extract_index`` int32 ``[B, K]``), padded to the
        batch's longest view (the preprocessor's ``features``)."""
        features = self.preprocessor.features(self._token_fields(fields), padding="longest")
        return features["input_ids"], features["extract_index"]

    def predict_tokens(self, input_ids, extract_index) -> dict:
        """Task outputs (float32) for the model's features; see the module doc."""
        inputs = {"input_ids": input_ids, "extract_index": extract_index,
                  "lm_weights": tf.zeros(tf.shape(input_ids), tf.float32)}  # read in training only
        out = tf.cast(self.model(inputs, training=False), tf.float32)
        if self.task.head == "regression":
            return {"score": out}
        probabilities = tf.nn.softmax(out, axis=-1)
        label_ids = tf.argmax(probabilities, axis=-1)
        names = tf.constant(list(self.task.label_names), tf.string)
        classes = tf.tile(names[None], [tf.shape(probabilities)[0], 1])
        return {"probabilities": probabilities, "label_ids": label_ids,
                "label_names": tf.gather(names, label_ids), "classes": classes}

    def _check_token_inputs(self, input_ids, extract_index) -> list:
        """Range checks of the ``tokens`` signature's inputs."""
        shape = tf.shape(input_ids)
        return [
            tf.debugging.assert_positive(shape[0], message="empty batch: send at least one example"),
            tf.debugging.assert_less_equal(shape[2], self.n_ctx, message=f"input_ids longer than n_ctx={self.n_ctx}"),
            tf.debugging.assert_equal(tf.shape(extract_index), shape[:2],
                                      message="extract_index must be [batch, views] like input_ids"),
            tf.debugging.assert_non_negative(input_ids, message="input_ids must be >= 0"),
            tf.debugging.assert_less(input_ids, self.total_vocab, message=f"input_ids must be < {self.total_vocab}"),
            tf.debugging.assert_non_negative(extract_index, message="extract_index must be >= 0"),
            tf.debugging.assert_less(extract_index, shape[2], message="extract_index must be < the length of input_ids"),
        ]

    # ---------------------------------------------------------------- signatures
    def signatures(self) -> dict:
        """``{name: ConcreteFunction}`` to pass to ``tf.saved_model.save``.

        The text -> features and features -> outputs graphs are traced once and called by every
        signature (one copy of each in the SavedModel).
        """
        features, predict = tf.function(self.features), tf.function(self.predict_tokens)
        specs = input_specs(self.task)
        parse = {name: tf.io.FixedLenFeature(spec.shape[1:], tf.string) for name, spec in specs.items()}

        def serve_text(**fields):
            return predict(*features(fields))

        def serve_features(**fields):
            input_ids, extract_index = features(fields)
            return {"input_ids": input_ids, "extract_index": extract_index}

        def serve_tokens(input_ids, extract_index):
            with tf.control_dependencies(self._check_token_inputs(input_ids, extract_index)):
                return predict(tf.identity(input_ids), tf.identity(extract_index))

        def classify(inputs):
            out = serve_text(**tf.io.parse_example(inputs, parse))
            return {"classes": out["classes"], "scores": out["probabilities"]}

        def regress(inputs):
            return {"outputs": serve_text(**tf.io.parse_example(inputs, parse))["score"]}

        k, examples = self.views, tf.TensorSpec([None], tf.string, name="inputs")
        out = {
            "serving_default": tf.function(serve_text).get_concrete_function(**specs),
            "features": tf.function(serve_features).get_concrete_function(**specs),
            "tokens": tf.function(serve_tokens).get_concrete_function(
                input_ids=tf.TensorSpec([None, k, None], tf.int32, name="input_ids"),
                extract_index=tf.TensorSpec([None, k], tf.int32, name="extract_index")),
        }
        if self.task.head == "regression":
            out["regress"] = tf.function(regress).get_concrete_function(examples)
        else:
            out["classify"] = tf.function(classify).get_concrete_function(examples)
        return out
