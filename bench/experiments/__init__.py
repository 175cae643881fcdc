"""The experiments: fine-tuning results on real data, ``reproduction`` (pre-trained vs scratch) and the §5
``study``. ``python -m bench.experiments.<name>``; each run is a ``python -m gpt_tf.train`` process recorded in a
resumable ledger (``reproduction``'s ``finetune_spec``, ``run_one``, ``load_ledger``: the study's runs too)."""
