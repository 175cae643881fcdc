"""Export and serving: TF Serving SavedModels, a TF Serving API server (gRPC + REST), a client.

Export (imports the model code):
    ``export`` (CLI) -> ``task_module`` / ``lm_module`` (the signatures, core TF ops only, built on
    ``gpt_tf.text.tf_tokenizer`` and ``gpt_tf.data.transforms``) -> ``saved_model_io`` (versions, method
    names, warm-up records).
Server (imports only tensorflow, grpcio and tensorflow-serving-api):
    ``server`` (CLI) -> ``server_config`` (models.config, batching file) -> ``model_registry``
    (version polling and swaps) -> ``servable`` (one version; TF Serving's request checks) ->
    ``batcher``; front ends ``grpc_service`` and ``rest`` (+ ``rest_json``); ``requests`` and
    ``errors`` convert protos and status codes.
Client: ``client`` (library and CLI), for this server or stock TF Serving; ``protos`` (TF Serving's messages
without TensorFlow's start-up, numpy <-> TensorProto).
All three need the ``serving`` extra (``pip install ".[serving]"`` in the checkout: grpcio, tensorflow-serving-api);
``extra`` checks for it first and names it when it is missing.
"""
