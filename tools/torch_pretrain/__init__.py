"""Pre-training on a GPU machine that has PyTorch but no TensorFlow: ``train`` (there; imports no TF and no
``gpt_tf``; the transformer reference, or Table 5's LSTM from ``lstm_model``; its files from ``pieces``),
``sweep.sh`` (several learning rates side by side there), ``piece.sh`` (one piece of a resumable run there),
``convert`` (here: records → token streams, the GPU's weights → a gpt_tf run folder). See README.md."""
