"""Training: one loop (``loop.TrainLoop``) and its objectives.

``lm_objective``    pre-training, the LM objective (Eq. 1): ``TrainConfig``, ``Pretrainer``;
``task_objective``  fine-tuning, the (multi-)task objective L3 = L2 + λ·L1 with its epoch
                    evaluation: ``FinetuneConfig``, ``Finetuner``;
``monitor``         what a pre-training run shows while it trains (TensorBoard, evals, samples);
"""
