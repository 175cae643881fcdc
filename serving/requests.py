"""Request and response protos <-> numpy, as TF Serving converts them."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import classification_pb2, model_pb2, regression_pb2

from serving.errors import invalid


def inputs_from_protos(tensors) -> dict:
    """A request's ``{alias: TensorProto}`` -> ``{alias: np.ndarray}`` (strings as bytes objects)."""
    out = {}
    for alias, proto in tensors.items():
        try:
            out[alias] = tf.make_ndarray(proto)
        except (TypeError, ValueError) as err:
            raise invalid(f"tensor parsing error: {alias} ({err})") from None
    return out


def examples_from_input(given) -> np.ndarray:
    """A ``tensorflow.serving.Input`` -> serialized ``tf.Example`` s (each example after the context)."""
    kind = given.WhichOneof("kind")
    if kind == "example_list":
        examples = [e.SerializeToString() for e in given.example_list.examples]
    elif kind == "example_list_with_context":
        context = given.example_list_with_context.context.SerializeToString()
        examples = [context + e.SerializeToString() for e in given.example_list_with_context.examples]
    else:
        examples = []
    if not examples:
        raise invalid("Input is empty.")
    return np.array(examples, dtype=object)


def model_spec(servable, signature: str) -> model_pb2.ModelSpec:
    """The ``model_spec`` a response carries: name, version and signature that answered."""
    spec = model_pb2.ModelSpec(name=servable.name, signature_name=signature)
    spec.version.value = servable.version
    return spec


def classification_result(classes, scores) -> classification_pb2.ClassificationResult:
    """``classes`` string ``[B, C]`` and/or ``scores`` float ``[B, C]`` -> ``ClassificationResult``."""
    first = classes if classes is not None else scores
    result = classification_pb2.ClassificationResult()
    for i in range(first.shape[0]):
        row = result.classifications.add()
        for c in range(first.shape[1]):
            item = row.classes.add()
            if classes is not None:
                item.label = classes[i, c].decode("utf-8", errors="replace")
            if scores is not None:
                item.score = float(scores[i, c])
    return result


def regression_result(values) -> regression_pb2.RegressionResult:
    """One float per example -> ``RegressionResult``."""
    return regression_pb2.RegressionResult(regressions=[regression_pb2.Regression(value=float(v)) for v in values])
