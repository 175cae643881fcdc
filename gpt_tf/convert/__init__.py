"""Weight conversion, in one place: every format a GPT-1 model's weights come in or go out as.

``layout``       where each weight of a ``GPT1Backbone`` sits in GPT-1's release and in ``transformers``' naming,
                 and what the formats share (arrays in, checked, then assigned all at once);
``release``      GPT-1's released shards (``params_{0..9}.npy`` + ``params_shapes.json``), both ways;
``state_dicts``  PyTorch state dicts: ``transformers``' ``OpenAIGPT*`` (both ways), Table 5's LSTM of
                 ``tools/torch_pretrain/lstm_model.py``, and state dicts saved as ``.npz`` parts;
``pretrained``   the pre-trained weights training and export start from (a pre-training run, a checkpoint
                 prefix, the release shards, a preset folder): their model config, and their weights into a
                 language model (fine-tuning's and continued pre-training's starts);
``presets``      keras-hub presets written from a run folder (pre-training: a backbone preset; fine-tuning: a
                 task preset), from the release shards or from a ``transformers`` state dict;
``__main__``     their command line, ``python -m gpt_tf.convert``.

The files sit in the layers their imports allow (``tests/test_layering.py``): the formats in the core,
``pretrained`` beside the run folders it reads (``gpt_tf/runs/``), ``presets`` on the family's tasks, the command
line on top. Nothing is imported here, so importing one of the files loads only what it needs.
"""
