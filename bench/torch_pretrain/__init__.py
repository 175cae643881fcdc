"""Pre-training on a lent GPU machine that has PyTorch but no TensorFlow: ``train`` (there; imports no TF and no
``gpt_tf``), ``sweep.sh`` (several learning rates side by side there), ``convert`` (here: records → token
streams, the accelerator's weights → a gpt_tf run folder)."""
