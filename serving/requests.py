"""Request and response protos <-> numpy, as TF Serving converts them."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import classification_pb2, model_pb2, regression_pb2

from serving.errors import invalid


# Elements a tensor may have beyond the values its proto carries (TensorProto's "repeat the last value" form, as
# tf.make_tensor_proto(0.0, shape=[n]) writes): a few bytes of request must not become gigabytes of server memory.
MAX_REPEATED_ELEMENTS = 1 << 22
MAX_RANK = 254  # TensorFlow's own limit on a shape's dimensions
_VALUE_FIELDS = ("float_val", "double_val", "int_val", "string_val", "int64_val", "bool_val", "half_val",
                 "uint32_val", "uint64_val", "scomplex_val", "dcomplex_val", "float8_val")


def inputs_from_protos(tensors) -> dict:
    """A request's ``{alias: TensorProto}`` -> ``{alias: np.ndarray}`` (strings as bytes objects).

    Whatever the proto holds, the answer is the array or INVALID_ARGUMENT naming the tensor: a type no request
    can carry (references, resources, variants, unknown numbers), a shape of unknown rank, a negative dimension
    or over ``MAX_RANK`` of them, values that do not fit the type (300 as uint8), content whose size does not
    match the shape, or more than ``MAX_REPEATED_ELEMENTS`` elements made by repeating the values given.
    """
    out = {}
    for alias, proto in tensors.items():
        _check_proto(alias, proto)
        try:
            out[alias] = tf.make_ndarray(proto)
        except (TypeError, ValueError, OverflowError, KeyError) as err:
            raise invalid(f"tensor parsing error: {alias} ({type(err).__name__}: {str(err)[:200]})") from None
    return out


def _check_proto(alias: str, proto) -> None:
    """What ``tf.make_ndarray`` would take for a request but must not: see ``inputs_from_protos``."""
    try:
        dtype = tf.dtypes.as_dtype(proto.dtype)
    except TypeError:
        raise invalid(f"tensor parsing error: {alias} has an unknown dtype number {proto.dtype}") from None
    if dtype._is_ref_dtype or dtype in (tf.resource, tf.variant) or dtype.as_numpy_dtype is object and dtype != tf.string:  # pylint: disable=protected-access
        raise invalid(f"tensor parsing error: {alias} has dtype {dtype.name}, which a request cannot carry")
    shape = proto.tensor_shape
    dims = [d.size for d in shape.dim]
    if shape.unknown_rank or len(dims) > MAX_RANK or any(d < 0 for d in dims):
        shown = "unknown rank" if shape.unknown_rank else f"shape {dims[:10]}{'...' if len(dims) > 10 else ''}"
        raise invalid(f"tensor parsing error: {alias} has {shown}: a tensor's shape is {MAX_RANK} or fewer "
                      "dimensions of size 0 or more")
    elements = 1
    for d in dims:
        elements *= d  # Python ints: no overflow
    if proto.tensor_content:
        return  # its size must match the shape exactly (make_ndarray's reshape checks it)
    given = max(len(getattr(proto, field)) for field in _VALUE_FIELDS)
    if elements - given > MAX_REPEATED_ELEMENTS:
        raise invalid(f"tensor parsing error: {alias} has shape {dims} ({elements} elements) but carries {given} "
                      f"value(s); repeating the last value is accepted up to {MAX_REPEATED_ELEMENTS} more elements")


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
