"""The model's building blocks, written once in ``keras.ops`` (every Keras backend).

``layers``       the layers, named after GPT-1's release scopes: ``Conv1D`` (a Keras ``Dense``),
                 ``CausalSelfAttention``, ``MLP``, ``LayerNorm``, ``TransformerBlock`` (post-LN), ``GPTEmbedding``
                 (a Keras ``ReversibleEmbedding`` and the position table; + the tied LM head);
``tf_pieces``    TensorFlow's faster drop-in pieces of the same arithmetic, chosen at run time
                 (``gpt_tf.backend.tf_pieces()``);
``task_head``    the fine-tuning head: ``Views`` (K views as rows), ``ExtractStates`` (the last block at the extract
                 tokens; in training λ·L1) and ``TaskHead`` (W_y on the extract token);
``transfer``     layer transfer (§5) and re-drawn special-token rows;
``objectives``   the training objectives' arithmetic: Eq. 1's LM loss, Eq. 5's L1 and the regression head's L2;
``optim``        ``GPTAdamW`` (decay on matrices only, one all-reduce then global-norm clipping), the warm-up +
                 cosine or linear schedule;
``recipes``      the paper's fine-tuning recipe, once (and its optimizer).

The keras-hub family (``gpt_tf/gpt1/``) builds its backbone and tasks from these. Nothing is imported here.
"""
