"""The gRPC API of TF Serving: ``tensorflow.serving.PredictionService`` (Predict, Classify, Regress,
GetModelMetadata) and ``tensorflow.serving.ModelService`` (GetModelStatus), from the
``tensorflow-serving-api`` protos, over a ``ModelRegistry``. A failed request is answered with
its status code and message; the server itself never goes down for one. Predict, Classify, Regress and
GetModelMetadata calls are counted and timed, failed ones too (``serving.monitoring``).
"""

from __future__ import annotations

import functools
import os

import grpc
import tensorflow as tf
from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,
                                     model_management_pb2, model_service_pb2_grpc, predict_pb2,
                                     prediction_service_pb2_grpc, regression_pb2)

from serving import monitoring
from serving.errors import ServingError, invalid
from serving.requests import (classification_result, examples_from_input, inputs_from_protos, model_spec,
                              regression_result)
from serving.servable import DEFAULT_SIGNATURE
from serving.server_config import model_configs

SIGNATURE_DEF = "signature_def"


def _handled(method):
    """Turns exceptions into gRPC status codes (ServingError's own, INTERNAL for bugs)."""
    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except ServingError as err:
            error = err
        except Exception as err:  # noqa: BLE001 -- reported to the client; the server stays up
            error = ServingError(grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")
        context.abort(error.code, error.message)

    return wrapper


def servable_for(registry, spec):
    """The servable a ``ModelSpec`` names (version, label or the latest: its ``version_choice`` oneof holds one)."""
    version = spec.version.value if spec.HasField("version") else None
    return registry.servable(spec.name, version, spec.version_label)


def model_metadata(registry, spec, fields) -> get_model_metadata_pb2.GetModelMetadataResponse:
    """GetModelMetadata: the servable's SignatureDefs (the only metadata field TF Serving has)."""
    if not fields:
        raise invalid("GetModelMetadataRequest must specify at least one metadata_field")
    for field in fields:
        if field != SIGNATURE_DEF:
            raise invalid(f"Metadata field {field} is not supported")
    servable = servable_for(registry, spec)
    response = get_model_metadata_pb2.GetModelMetadataResponse(model_spec=model_spec(servable, ""))
    response.model_spec.ClearField("signature_name")
    signatures = get_model_metadata_pb2.SignatureDefMap()
    for name, definition in servable.signature_defs.items():
        signatures.signature_def[name].CopyFrom(definition)
    response.metadata[SIGNATURE_DEF].Pack(signatures)
    return response


def model_status(registry, spec) -> get_model_status_pb2.GetModelStatusResponse:
    """GetModelStatus: state and status of every version (or the one the spec names)."""
    version = spec.version.value if spec.HasField("version") else None
    response = get_model_status_pb2.GetModelStatusResponse()
    for number, state, error in registry.status(spec.name, version):
        entry = response.model_version_status.add(version=number, state=state)
        entry.status.SetInParent()
        if error:
            entry.status.error_code = grpc.StatusCode.UNKNOWN.value[0]
            entry.status.error_message = error
    return response


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """Predict / Classify / Regress / GetModelMetadata over the registry's servables."""

    def __init__(self, registry):
        self.registry = registry

    @_handled
    def Predict(self, request, context):
        signature = request.model_spec.signature_name or DEFAULT_SIGNATURE
        with monitoring.Call("GRPC", "Predict", request.model_spec, signature) as call:
            servable = servable_for(self.registry, request.model_spec)
            call.served(servable.version)
            outputs = servable.predict(signature, inputs_from_protos(request.inputs), list(request.output_filter))
            response = predict_pb2.PredictResponse(model_spec=model_spec(servable, signature))
            for alias, value in outputs.items():
                response.outputs[alias].CopyFrom(tf.make_tensor_proto(value))
            return response

    @_handled
    def Classify(self, request, context):
        signature = request.model_spec.signature_name or DEFAULT_SIGNATURE
        with monitoring.Call("GRPC", "Classify", request.model_spec, signature) as call:
            servable = servable_for(self.registry, request.model_spec)
            call.served(servable.version)
            classes, scores = servable.classify(signature, examples_from_input(request.input))
            return classification_pb2.ClassificationResponse(model_spec=model_spec(servable, signature),
                                                             result=classification_result(classes, scores))

    @_handled
    def Regress(self, request, context):
        signature = request.model_spec.signature_name or DEFAULT_SIGNATURE
        with monitoring.Call("GRPC", "Regress", request.model_spec, signature) as call:
            servable = servable_for(self.registry, request.model_spec)
            call.served(servable.version)
            values = servable.regress(signature, examples_from_input(request.input))
            return regression_pb2.RegressionResponse(model_spec=model_spec(servable, signature),
                                                     result=regression_result(values))

    @_handled
    def GetModelMetadata(self, request, context):
        with monitoring.Call("GRPC", "GetModelMetadata", request.model_spec) as call:
            response = model_metadata(self.registry, request.model_spec, list(request.metadata_field))
            call.served(response.model_spec.version.value)
            return response


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """GetModelStatus, and HandleReloadConfigRequest: the models of a ``ModelServerConfig`` served from now on
    (``ModelRegistry.reconfigure``); relative base paths are taken from the server's working directory."""

    def __init__(self, registry):
        self.registry = registry

    @_handled
    def GetModelStatus(self, request, context):
        return model_status(self.registry, request.model_spec)

    @_handled
    def HandleReloadConfigRequest(self, request, context):
        try:
            configs = model_configs(request.config, "ReloadConfigRequest", os.getcwd())
        except ValueError as err:
            raise invalid(str(err)) from None
        self.registry.reconfigure(configs)  # a refused label: its ServingError is the answer
        response = model_management_pb2.ReloadConfigResponse()
        response.status.error_code = grpc.StatusCode.OK.value[0]
        return response
