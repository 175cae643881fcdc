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


def paper_schedule(learning_rate=PAPER_FINETUNE["learning_rate"], warmup_fraction=PAPER_FINETUNE["warmup_fraction"],
                   train_steps=None):
    """Fine-tuning's learning rate (§4.1): a linear warm-up over ``warmup_fraction`` of ``train_steps`` updates, then
    linear decay to 0 at ``train_steps``; without ``train_steps``, ``learning_rate`` throughout (Keras's ``fit``
    does not tell the optimizer how long it will run)."""
    import math  # pylint: disable=import-outside-toplevel

    from gpt_tf.nn.optim import WarmupDecay  # pylint: disable=import-outside-toplevel

    if not train_steps:
        return float(learning_rate)
    return WarmupDecay(learning_rate, math.ceil(warmup_fraction * train_steps), train_steps, "linear")


def paper_optimizer(learning_rate=PAPER_FINETUNE["learning_rate"], warmup_fraction=PAPER_FINETUNE["warmup_fraction"],
                    weight_decay=PAPER_FINETUNE["weight_decay"], clip_norm=PAPER_FINETUNE["clip_norm"],
                    train_steps=None, gradient_accumulation_steps=None):
    """Fine-tuning's optimizer (§4.1): ``GPTAdamW`` on ``paper_schedule``."""
    from gpt_tf.nn.optim import make_optimizer  # pylint: disable=import-outside-toplevel

    return make_optimizer(paper_schedule(learning_rate, warmup_fraction, train_steps), weight_decay, clip_norm,
                          gradient_accumulation_steps=gradient_accumulation_steps)
