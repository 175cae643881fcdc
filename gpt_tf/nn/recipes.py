"""The paper's fine-tuning recipe (§4.1, "Fine-tuning details"), written once.

``FinetuneConfig``'s defaults, the fine-tuning defaults of ``python -m gpt_tf.train --task`` and the keras-hub
tasks' ``compile()`` defaults (``gpt_tf/gpt1/task.py``) come from here; ``configs/finetune_paper.flags`` says
the same to the command line (tests/test_flags.py holds the two equal). Weight decay 0.01 and clipping at
norm 1 are pre-training's too (§4.1), so ``TrainConfig`` and the CLI's flags take them from here as well.
"""

PAPER_FINETUNE = {
    "learning_rate": 6.25e-5,
    "batch_size": 32,
    "epochs": 3,
    "lr_decay": "linear",
    "warmup_fraction": 0.002,  # 0.2% of all updates
    "lm_coef": 0.5,  # λ of the auxiliary LM loss (Eq. 5)
    "clf_pdrop": 0.1,  # dropout before the classifier
    "weight_decay": 0.01,  # decoupled, on weight matrices only (as in pre-training)
    "clip_norm": 1.0,  # gradients clipped to this global norm (as in pre-training)
}
