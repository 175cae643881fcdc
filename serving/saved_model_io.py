"""Writing servable versions: ``<base>/<model_name>/<version>/`` SavedModels as TF Serving reads them.

* ``save_version`` writes the SavedModel into a hidden temporary folder beside the target
  (``.<version>.tmp-<pid>``) and renames it into place, so a model server polling the base path
  never sees half a version; the temporary folders of killed exports are removed as the data
  builders remove theirs (``gpt_tf.data.common.remove_stale_temps``). A save the storage refuses (a full
  disk, a read-only folder) removes its temporary folder and raises ``gpt_tf.write_errors.WriteError``
  naming the version: the versions already there are untouched.
* TF2's ``tf.saved_model.save`` marks every signature ``tensorflow/serving/predict``; TF Serving's
  Classify and Regress APIs refuse signatures without their own method name, so the names in
  ``METHOD_NAMES`` are written into ``saved_model.pb`` afterwards (and ``fingerprint.pb`` is
  recomputed for the new bytes).
* ``assets.extra/tf_serving_warmup_requests`` holds ``PredictionLog`` records that TF Serving
  (and ``serving.server``) replay after loading, before the version takes traffic.
"""

from __future__ import annotations

import os
import re
import shutil

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting
from tensorflow_serving.apis import (classification_pb2, input_pb2, model_pb2, predict_pb2, prediction_log_pb2,
                                     regression_pb2)

from gpt_tf.write_errors import writing
from gpt_tf.data.common import remove_stale_temps
from gpt_tf.speed import kernels

METHOD_NAMES = {"classify": "tensorflow/serving/classify", "regress": "tensorflow/serving/regress"}
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
# The options of every save; ``traced_signatures`` traces under the same ones, so the save finds its traces.
SAVE_OPTIONS = tf.saved_model.SaveOptions()
_VERSION = re.compile(r"^\d+$")


def versions(model_dir: str) -> list[int]:
    """The numeric version folders under ``model_dir`` (``<base>/<model_name>``), ascending."""
    if not tf.io.gfile.isdir(model_dir):
        return []
    return sorted(int(name.rstrip("/")) for name in tf.io.gfile.listdir(model_dir) if _VERSION.match(name.rstrip("/")))


def set_method_names(export_dir: str, method_names: dict) -> None:
    """Rewrites the method name of the listed signatures in ``export_dir/saved_model.pb``."""
    path = os.path.join(export_dir, "saved_model.pb")
    proto = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    signatures = proto.meta_graphs[0].signature_def
    for name, method in method_names.items():
        if name in signatures:
            signatures[name].method_name = method
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    with open(os.path.join(export_dir, "fingerprint.pb"), "wb") as f:
        f.write(fingerprinting.CreateFingerprintDef(export_dir))


def predict_log(model_name: str, signature: str, inputs: dict) -> prediction_log_pb2.PredictionLog:
    """A warm-up record: a Predict request with numpy-convertible ``inputs``."""
    request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature))
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    return prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))


def examples_log(model_name: str, signature: str, examples: list, regress: bool) -> prediction_log_pb2.PredictionLog:
    """A warm-up record: a Classify (or Regress) request over ``tf.train.Example`` protos."""
    spec = model_pb2.ModelSpec(name=model_name, signature_name=signature)
    given = input_pb2.Input(example_list=input_pb2.ExampleList(examples=examples))
    if regress:
        log = prediction_log_pb2.RegressLog(request=regression_pb2.RegressionRequest(model_spec=spec, input=given))
        return prediction_log_pb2.PredictionLog(regress_log=log)
    log = prediction_log_pb2.ClassifyLog(request=classification_pb2.ClassificationRequest(model_spec=spec, input=given))
    return prediction_log_pb2.PredictionLog(classify_log=log)


def text_example(fields: dict) -> "tf.train.Example":
    """``{name: str or list of str}`` -> a ``tf.train.Example`` of bytes features."""
    def feature(value):
        values = [value] if isinstance(value, str) else list(value)
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode("utf-8") for v in values]))

    return tf.train.Example(features=tf.train.Features(feature={k: feature(v) for k, v in fields.items()}))


def traced_signatures(module: tf.Module) -> dict:
    """``module.signatures()`` traced in the context ``tf.saved_model.save`` traces in, so that saving reuses
    these traces. TensorFlow keys its traces on that context: outside it, saving would trace every
    ``tf.function`` that ``module`` holds a second time (the in-graph tokenizer's takes seconds). Traced inside
    ``kernels.portable()``: another process runs them (no kernel of this library, no oneDNN-only op)."""
    from tensorflow.python.saved_model import save_context  # pylint: disable=import-outside-toplevel

    with save_context.save_context(SAVE_OPTIONS), kernels.portable():
        return module.signatures()


def save_version(module: tf.Module, signatures: dict, base_path: str, model_name: str, version: int = 0,
                 warmup=()) -> str:
    """Writes ``module`` as ``<base_path>/<model_name>/<version>`` (0: one above the newest); returns it."""
    model_dir = os.path.join(base_path, model_name)
    version = version or (max(versions(model_dir), default=0) + 1)
    target = os.path.join(model_dir, str(version))
    if tf.io.gfile.exists(target):
        raise FileExistsError(f"{target} already exists: versions are immutable, export a new one")
    remove_stale_temps(model_dir)  # a killed export's, of any version
    return save_at(module, signatures, target, warmup)


def free_target(target: str) -> str:
    """``target`` as an absolute path that a SavedModel may take: absent, or an empty folder (removed here);
    FileExistsError naming it when it holds anything (check before tracing the signatures)."""
    target = os.path.abspath(target)
    if os.path.isdir(target) and not os.listdir(target):
        os.rmdir(target)
    elif os.path.exists(target):
        raise FileExistsError(f"{target} already exists and is not an empty folder: export to a new path")
    return target


def save_at(module: tf.Module, signatures: dict, target: str, warmup=()) -> str:
    """Writes ``module`` as the SavedModel folder ``target`` (absent, or an empty folder: ``free_target``),
    which appears whole (written beside it, then renamed); returns ``target``."""
    target = free_target(target)
    folder = os.path.dirname(target)
    os.makedirs(folder, exist_ok=True)
    remove_stale_temps(folder, os.path.basename(target))  # a killed export's, of this target
    tmp = os.path.join(folder, f".{os.path.basename(target)}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with writing(target), kernels.portable():  # a full disk, a read-only folder: WriteError, no part stays
            tf.saved_model.save(module, tmp, signatures=signatures, options=SAVE_OPTIONS)
            set_method_names(tmp, {k: v for k, v in METHOD_NAMES.items() if k in signatures})
            if warmup:
                os.makedirs(os.path.join(tmp, "assets.extra"), exist_ok=True)
                with tf.io.TFRecordWriter(os.path.join(tmp, WARMUP_FILE)) as writer:
                    for record in warmup:
                        writer.write(record.SerializeToString())
            os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def read_warmup(export_dir: str) -> list:
    """The ``PredictionLog`` records of a version's warm-up file ([] when it has none)."""
    path = os.path.join(export_dir, WARMUP_FILE)
    if not tf.io.gfile.exists(path):
        return []
    records = []
    for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
        records.append(prediction_log_pb2.PredictionLog.FromString(raw))
    return records
