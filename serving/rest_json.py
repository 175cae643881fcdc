"""TF Serving's REST JSON (``tensorflow_serving/util/json_tensor.cc``) <-> numpy and protos.

* Predict requests: ``{"signature_name": ..., "instances": [...]}`` (row format: one entry per
  example, an object per example when the signature has several inputs) or
  ``{"inputs": ...}`` (columnar: one value, or an object of named values). Strings are JSON
  strings (UTF-8) or ``{"b64": "<base64>"}``; lists must be rectangular.
* Predict responses mirror the request: ``{"predictions": [...]}`` or ``{"outputs": ...}``.
  Floats are written with the shortest text that reads back as the same float32; output
  names ending in ``_bytes`` (and strings that are not UTF-8) come back as ``{"b64": ...}``.
* Classify / Regress requests: ``{"signature_name", "context": {...}, "examples": [{...}]}``
  with ``tf.Example`` features as JSON values; responses ``{"results": ...}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re

import numpy as np
import tensorflow as tf

from serving.errors import invalid

_JSON_TYPES = {dict: "Object", list: "Array", str: "String", bool: "True/False", type(None): "Null"}
MAX_JSON_DEPTH = 100  # nesting of arrays/objects in a request body (a tensor has at most 254 dimensions in TF)
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEP = np.zeros(256, np.int8)
_BRACKET_STEP[list(b"[{")], _BRACKET_STEP[list(b"]}")] = 1, -1


def _json_type(value) -> str:
    return _JSON_TYPES.get(type(value), "Number")


def json_depth(body: bytes) -> int:
    """Deepest nesting of ``[`` / ``{`` in a JSON text, brackets inside strings left out (C-speed scans)."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    return int(np.cumsum(_BRACKET_STEP[np.frombuffer(brackets, np.uint8)], dtype=np.int64).max())


def parse_body(body: bytes) -> dict:
    """The request body as a JSON object; nesting deeper than ``MAX_JSON_DEPTH`` is refused unparsed."""
    if not body:
        raise invalid("JSON Parse error: The document is empty")
    depth = json_depth(body)
    if depth > MAX_JSON_DEPTH:
        raise invalid(f"JSON Parse error: nesting depth {depth} exceeds the limit of {MAX_JSON_DEPTH}")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise invalid(f"JSON Parse error: {err}") from None
    if not isinstance(doc, dict):
        raise invalid(f"JSON Value: {_excerpt(body)} Is not object")
    return doc


def _excerpt(body: bytes, limit: int = 100) -> str:
    """The start of a request body, for an error message (never the whole of a large one)."""
    return body[:limit].decode("utf-8", errors="replace")


def signature_name(doc: dict) -> str:
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise invalid("'signature_name' key must be a string value.")
    return name


def _is_b64(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _b64(value) -> bytes:
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError):
        raise invalid("Unable to base64 decode") from None


def utf8(text: str) -> bytes:
    """A JSON string as UTF-8; one that holds a lone surrogate (``"\\ud800"``, valid JSON) is a 400, not a crash."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise invalid(f"JSON Value: {json.dumps(text)[:100]} is not valid UTF-8 text: lone surrogate "
                      f"{json.dumps(text[err.start])} at character {err.start}") from None


def _in_range(value: int, dtype: tf.DType) -> int:
    """``value`` if ``dtype`` (an integer type) can hold it, else a 400 naming both."""
    if not dtype.min <= value <= dtype.max:
        raise invalid(f"JSON Value: {str(value)[:100]} is out of range for {dtype.name} "
                      f"[{dtype.min}, {dtype.max}]")
    return value


def _leaf(value, dtype: tf.DType):
    """One JSON scalar as a value of ``dtype`` (TF Serving's type rules: no bools as numbers)."""
    ok = False
    if dtype == tf.string:
        if isinstance(value, str):
            return utf8(value)
        if _is_b64(value):
            return _b64(value)
    elif dtype == tf.bool:
        ok = isinstance(value, bool)
    elif dtype.is_integer:
        if isinstance(value, int) and not isinstance(value, bool):
            return _in_range(value, dtype)
    elif dtype.is_floating:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        raise invalid(f"JSON Value: {json.dumps(value)[:100]} Type: {_json_type(value)} is not of expected type: "
                      f"{dtype.name}")
    return value


def to_array(value, dtype: tf.DType) -> np.ndarray:
    """A (nested, rectangular) JSON value -> numpy array of ``dtype`` (strings as bytes objects)."""
    shape, probe = [], value
    while isinstance(probe, list):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    leaves = []

    def walk(item, level):
        if isinstance(item, list):
            if level >= len(shape):
                raise invalid(f"Encountered list at unexpected level: {level} expected < {len(shape)}")
            if len(item) != shape[level]:
                raise invalid(f"Encountered list at unexpected size: {len(item)} at level: {level} "
                              f"expected size: {shape[level]}")
            for element in item:
                walk(element, level + 1)
        elif level != len(shape):
            raise invalid(f"JSON Value: {json.dumps(item)[:100]} found at incorrect level: {level + 1} in the JSON "
                          f"DOM. Expected at level: {len(shape)}")
        else:
            leaves.append(_leaf(item, dtype))

    walk(value, 0)
    kind = object if dtype == tf.string else dtype.as_numpy_dtype
    array = np.empty(len(leaves), dtype=kind)
    array[:] = leaves
    try:
        return array.reshape(shape)
    except ValueError as err:  # more dimensions than NumPy holds (64): JSON within the nesting limit can say so
        raise invalid(f"JSON Value: a tensor of {len(shape)} dimensions cannot be made ({err})") from None


def predict_inputs(doc: dict, infos: dict) -> tuple[dict, str]:
    """(``{input: np.ndarray}``, ``"row"`` or ``"columnar"``) of a predict request body."""
    dtypes = {name: tf.dtypes.as_dtype(info.dtype) for name, info in infos.items()}
    if ("instances" in doc) == ("inputs" in doc):
        raise invalid("Missing 'inputs' or 'instances' key" if "inputs" not in doc else
                      "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist")
    if "inputs" in doc:
        value = doc["inputs"]
        if not isinstance(value, dict) or _is_b64(value):
            if len(dtypes) > 1:
                raise invalid("inputs is a plain value/list, but expecting an object as multiple input tensors "
                              "required as per tensorinfo_map")
            name = next(iter(dtypes))
            return {name: to_array(value, dtypes[name])}, "columnar"
        missing = [n for n in sorted(dtypes) if n not in value]
        if missing:
            raise invalid(f"Missing named input: {missing[0]} in 'inputs' object.")
        return {name: to_array(value[name], dtype) for name, dtype in dtypes.items()}, "columnar"
    instances = doc["instances"]
    if not isinstance(instances, list):
        raise invalid("Excepting 'instances' to be an list/array")
    if not instances:
        raise invalid("No values in 'instances' array")
    objects = isinstance(instances[0], dict) and not _is_b64(instances[0])
    if not objects and len(dtypes) > 1:
        raise invalid("instances is a plain list, but expecting list of objects as multiple input tensors required "
                      "as per tensorinfo_map")
    if not objects:
        name = next(iter(dtypes))
        return {name: to_array(instances, dtypes[name])}, "row"
    columns = {name: [] for name in dtypes}
    for i, instance in enumerate(instances):
        if not isinstance(instance, dict) or _is_b64(instance):
            raise invalid(f"Expecting object but got list at item {i} of input list")
        if set(instance) != set(dtypes):
            raise invalid(f"Failed to process element: {i} of 'instances' list. JSON object keys must be equal to: "
                          f"{','.join(sorted(dtypes))}")
        for name in dtypes:
            columns[name].append(instance[name])
    return {name: to_array(values, dtypes[name]) for name, values in columns.items()}, "row"


def _json_leaf(value, as_bytes: bool):
    if isinstance(value, bytes):
        if not as_bytes:
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                pass
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, np.floating):
        return float(str(value))  # shortest text that reads back as the same float32 / float64
    return value.item() if isinstance(value, np.generic) else value


def to_json(array: np.ndarray, name: str):
    """A numpy value as nested JSON lists (see the module doc for floats and bytes)."""
    array = np.asarray(array)
    as_bytes = name.endswith("_bytes")
    if array.ndim == 0:
        return _json_leaf(array[()], as_bytes)
    return [to_json(element, name) if np.ndim(element) else _json_leaf(element, as_bytes) for element in array]


def predict_response(outputs: dict, form: str) -> dict:
    """``{"predictions": ...}`` (row) or ``{"outputs": ...}`` (columnar)."""
    names = sorted(outputs)
    if form == "columnar":
        if len(names) == 1:
            return {"outputs": to_json(outputs[names[0]], names[0])}
        return {"outputs": {name: to_json(outputs[name], name) for name in names}}
    sizes = {np.shape(outputs[name])[0] if np.ndim(outputs[name]) else None for name in names}
    if len(sizes) != 1 or None in sizes:
        raise invalid(f"outputs {names} have inconsistent batch sizes {sorted(map(str, sizes))}")
    rows = sizes.pop()
    if len(names) == 1:
        return {"predictions": [to_json(outputs[names[0]][i], names[0]) for i in range(rows)]}
    return {"predictions": [{name: to_json(outputs[name][i], name) for name in names} for i in range(rows)]}


def _feature(name: str, value) -> tf.train.Feature:
    values = value if isinstance(value, list) else [value]
    kinds, items = set(), []
    for item in values:
        if isinstance(item, bool) or isinstance(item, int):
            kinds.add("int64")
            items.append(_in_range(int(item), tf.int64))
        elif isinstance(item, float):
            kinds.add("float")
            items.append(item)
        elif isinstance(item, str) or _is_b64(item):
            kinds.add("bytes")
            items.append(utf8(item) if isinstance(item, str) else _b64(item))
        else:
            raise invalid(f"Feature: {name} has element with unexpected JSON type: {_json_type(item)}")
    if len(kinds) > 1:
        raise invalid(f"Unexpected element type in feature: {name} expecting a single type, got {sorted(kinds)}")
    kind = kinds.pop() if kinds else "bytes"
    if kind == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=items))
    if kind == "float":
        return tf.train.Feature(float_list=tf.train.FloatList(value=items))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=items))


def _example(value) -> tf.train.Example:
    if not isinstance(value, dict):
        raise invalid(f"Example must be JSON object but got JSON {_json_type(value)}")
    for name in value:
        utf8(name)  # a feature name is a proto string: it must be UTF-8 too
    return tf.train.Example(features=tf.train.Features(feature={k: _feature(k, v) for k, v in value.items()}))


def examples_from_json(doc: dict) -> np.ndarray:
    """Serialized ``tf.Example`` s of a classify / regress body (context first, as TF Serving does)."""
    if "examples" not in doc:
        raise invalid("When method is classify, key 'examples' is expected and was not found")
    examples = doc["examples"]
    if not isinstance(examples, list):
        raise invalid("Expecting 'examples' value to be an list/array")
    if not examples:
        raise invalid("'examples' value is an empty array")
    context = _example(doc["context"]).SerializeToString() if "context" in doc else b""
    return np.array([context + _example(e).SerializeToString() for e in examples], dtype=object)


def classify_response(classes, scores) -> dict:
    """``{"results": [[[label, score], ...] per example]}``."""
    first = classes if classes is not None else scores
    return {"results": [[[classes[i, c].decode("utf-8", errors="replace") if classes is not None else "",
                          _json_leaf(scores[i, c], False) if scores is not None else 0.0]
                         for c in range(first.shape[1])] for i in range(first.shape[0])]}


def regress_response(values) -> dict:
    return {"results": [_json_leaf(np.float32(v), False) for v in values]}
