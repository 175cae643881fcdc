"""The run folder, in one place: what training writes into it, who may write it, and how a finished run is read.

``files``        the folder's names (``model_config.json``, ``train_config.json`` / ``finetune_config.json``,
                 ``data.json``, ``checkpoints/``), their atomic writes, the data's identity and what a resume
                 must match (no TensorFlow);
``lock``         one trainer per folder (``lock_run_dir``) and, of a cluster, the chief (``chief_task``);
``checkpoints``  the checkpoints: keys, managers, the newest intact one restored, a finished run's model read back;
``folder``       ``RunFolder``: a finished run read once (configs, data manifests, tasks, tokenizer, checkpoints);
``submissions``  a fine-tuning run's predictions in GLUE's submission layout.

Training, export, zero-shot, the conversion to presets and the §5 study use it. ``folder`` and ``submissions``
read data folders (``pipelines``), so the package sits above ``pipelines`` and below training and serving
(``tests/test_layering.py``). Nothing is imported here.
"""
