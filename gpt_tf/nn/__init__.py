"""The model's building blocks, written once in ``keras.ops`` (every Keras backend).

``layers``       the layers, named after GPT-1's release scopes: ``Conv1D``, ``CausalSelfAttention``, ``MLP``,
                 ``LayerNorm``, ``TransformerBlock`` (post-LN), ``GPTEmbedding`` (+ the tied LM head);
``tf_pieces``    TensorFlow's faster drop-in pieces of the same arithmetic, chosen at run time
                 (``gpt_tf.backend.tf_pieces()``);
``task_model``   the fine-tuning head ``GPTTaskModel``: W_y on the extract token, and the LM logits for L1;
``objectives``   the training objectives' arithmetic: Eq. 1's LM loss, Eq. 5, fine-tuning's L2 + λ·L1;
``optim``        ``GPTAdamW`` (decay on matrices only, global-norm clipping) and the warm-up + cosine schedule.

The keras-hub family (``gpt_tf/gpt1/``) builds its backbone and tasks from these. Nothing is imported here.
"""
