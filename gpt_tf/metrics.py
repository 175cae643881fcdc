"""Evaluation metrics of the paper's Tables 2–4, in plain numpy (no scikit-learn / scipy at run time).

* ``accuracy``: fraction of exact matches (SNLI, MNLI, QNLI, RTE, SciTail, SST-2, RACE, Story Cloze).
* ``f1``: binary F1 of the positive class 1 (MRPC, QQP); 0 when there is no positive at all.
* ``pearson`` / ``spearman``: correlations for STS-B; Spearman uses average ranks for ties.
  A constant input leaves a correlation undefined; it is reported as 0 (scipy gives nan).
* ``matthews``: Matthews correlation (CoLA), the multiclass form (Gorodkin 2004; equal to the binary
  phi coefficient for two classes); 0 when undefined, e.g. constant predictions, as in scikit-learn.

RACE-m/-h/-all and MNLI-m/-mm are separate eval splits; the caller computes metrics per split.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np


def _pair(y_true, y_pred) -> tuple[np.ndarray, np.ndarray]:
    """Both inputs as 1-D arrays of one length, with a clear error otherwise."""
    t, p = np.asarray(y_true).reshape(-1), np.asarray(y_pred).reshape(-1)
    if t.shape != p.shape:
        raise ValueError(f"y_true has {t.size} values but y_pred has {p.size}")
    if t.size == 0:
        raise ValueError("metrics need at least one example, got none")
    return t, p


def accuracy(y_true, y_pred) -> float:
    """Fraction of predictions equal to the label."""
    t, p = _pair(y_true, y_pred)
    return float(np.mean(t == p))


def f1(y_true, y_pred) -> float:
    """Binary F1 with class 1 as positive: 2·TP / (2·TP + FP + FN); 0 when that is 0/0."""
    t, p = _pair(y_true, y_pred)
    tp = float(np.sum((t == 1) & (p == 1)))
    fp = float(np.sum((t != 1) & (p == 1)))
    fn = float(np.sum((t == 1) & (p != 1)))
    denominator = 2 * tp + fp + fn
    return 2 * tp / denominator if denominator else 0.0


def pearson(y_true, y_pred) -> float:
    """Pearson's r (float64); 0 when either input is constant."""
    t, p = _pair(y_true, y_pred)
    t, p = t.astype(np.float64) - t.mean(dtype=np.float64), p.astype(np.float64) - p.mean(dtype=np.float64)
    scale = np.sqrt(np.dot(t, t) * np.dot(p, p))
    return float(np.clip(np.dot(t, p) / scale, -1.0, 1.0)) if scale > 0 else 0.0


def rankdata(values) -> np.ndarray:
    """Ranks 1..n, ties sharing the average of their ranks (scipy's ``rankdata(method="average")``)."""
    values = np.asarray(values).reshape(-1)
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # Start of each run of equal values, and the run every sorted position belongs to.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    run = np.cumsum(np.r_[True, sorted_values[1:] != sorted_values[:-1]]) - 1
    ends = np.r_[starts[1:], values.size]  # exclusive
    average = (starts + ends + 1) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = average[run]
    return ranks


def spearman(y_true, y_pred) -> float:
    """Spearman's rho: Pearson's r of the average ranks."""
    t, p = _pair(y_true, y_pred)
    return pearson(rankdata(t), rankdata(p))


def matthews(y_true, y_pred) -> float:
    """Matthews correlation coefficient (multiclass form); 0 when undefined."""
    t, p = _pair(y_true, y_pred)
    labels, codes = np.unique(np.concatenate([t, p]), return_inverse=True)
    n = labels.size
    confusion = np.bincount(codes[: t.size] * n + codes[t.size :], minlength=n * n).reshape(n, n).astype(np.float64)
    true_sum, pred_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    samples, correct = confusion.sum(), np.trace(confusion)
    cov_tp = correct * samples - np.dot(true_sum, pred_sum)
    cov_pp = samples**2 - np.dot(pred_sum, pred_sum)
    cov_tt = samples**2 - np.dot(true_sum, true_sum)
    if cov_pp * cov_tt == 0:
        return 0.0
    return float(cov_tp / np.sqrt(cov_tt * cov_pp))


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "pearson": pearson,
    "spearman": spearman,
    "matthews": matthews,
}


def compute_metrics(task, y_true, predictions) -> dict[str, float]:
    """The task's metrics (``task.metrics``, headline first) on one eval split.

    ``predictions`` are class / candidate ids, or scores for a regression task; a 2-D array of
    per-class logits for a non-regression task is reduced by argmax. ``task`` is a ``TaskSpec``
    or its dict form.
    """
    names = task["metrics"] if isinstance(task, Mapping) else task.metrics
    head = task["head"] if isinstance(task, Mapping) else task.head
    predictions = np.asarray(predictions)
    if head != "regression" and predictions.ndim == 2:
        predictions = predictions.argmax(axis=-1)
    unknown = [name for name in names if name not in METRICS]
    if unknown:
        raise KeyError(f"unknown metric(s) {unknown}; known: {sorted(METRICS)}")
    return {name: METRICS[name](y_true, predictions) for name in names}
