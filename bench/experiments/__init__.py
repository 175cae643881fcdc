"""The experiments: fine-tuning results on real data (``reproduction``, the §5 ``study``), the books model's
zero-shot curve, the frozen-feature probe, the README's Python API at full scale. ``python -m
bench.experiments.<name>``; each run is a ``python -m gpt_tf.train`` process recorded in a resumable ledger."""
