"""The paper's §5 analysis, on top of the core and the training code.

``heuristics``  the zero-shot heuristics (``ZeroShotSuite``) on ``lm_scorer.LMScorer``;
``zero_shot``   the command line that runs them on a pre-training run's kept checkpoints;
``baselines``   reference numbers (the unigram perplexity of a token stream).
"""
