"""What makes training fast on a CPU, none of it changing the arithmetic's meaning.

``choices``          the speed choices a run makes, one value (``SpeedChoices``), set once per process and read
                     by the code that traces graphs; the environment variables that override them by hand;
``resolve``          a run's choices found before any model is built (``--speed=auto|default|<file>``);
``kernels/``         fused C++ kernels of the training step (AdamW, GELU, layer norm, dropout), built once per
                     machine against the installed TensorFlow;
``autotune``         the machine's threading, oneDNN and fused-kernel settings, timed once and cached;
``precision``        float32 / bfloat16 choice for the machine;
``aliased_grads``    the padded weight gradient where cache-set aliasing slows oneDNN;
``inference_gelu``   the evaluation passes' GELU by the fused kernel where it is faster;
``machine_cache``    the per-machine cache those decisions are kept in (``~/.cache/gpt_tf/``).

Nothing is imported here.
"""
