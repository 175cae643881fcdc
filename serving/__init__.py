"""Export and serving (TF Serving SavedModels, gRPC/REST server, client): see WORKSPACE.md.

Built on the in-graph tokenizer (`gpt_tf.tf_tokenizer`), which uses core TensorFlow ops only so
that exported SavedModels load in stock TF Serving.
"""
