"""The model's building blocks, written once in ``keras.ops`` (every Keras backend).

``layers``       the layers, named after GPT-1's release scopes: ``Conv1D`` (a Keras ``Dense``),
                 ``CausalSelfAttention``, ``MLP``, ``LayerNorm``, ``TransformerBlock`` (post-LN), ``GPTEmbedding``
                 (a Keras ``ReversibleEmbedding`` and the position table; + the tied LM head);
``tf_pieces``    TensorFlow's faster drop-in pieces of the same arithmetic, chosen at run time
                 (``gpt_tf.backend.tf_pieces()``);
``task_head``    the fine-tuning head: ``Views`` (K views as rows) and ``TaskHead`` (W_y on the extract token);
``transfer``     layer transfer (§5) and re-drawn special-token rows;
``objectives``   the training objectives' arithmetic: Eq. 1's LM loss, Eq. 5, fine-tuning's L2 + λ·L1;
``optim``        ``GPTAdamW`` (decay on matrices only, global-norm clipping), the warm-up + cosine schedule and
                 the update after one all-reduce (``all_reduce_and_apply``);
``recipes``      the paper's fine-tuning recipe, once.

The keras-hub family (``gpt_tf/gpt1/``) builds its backbone and tasks from these. Nothing is imported here.
"""
