"""The task metrics (``gpt_tf/metrics.py``) against scikit-learn and SciPy, and a task's predictions (class ids or
scores) from its outputs: numpy computes them (the outputs are only cast and compared), so nothing here depends on
how TensorFlow rounds (none of it is in tests/conftest.py's NUMERICS)."""

import numpy as np
import pytest

from gpt_tf import metrics
from gpt_tf.nn.task_head import task_predictions
from gpt_tf.tasks import get_task


def test_task_predictions_and_compute_metrics():
    mrpc, stsb = get_task("mrpc"), get_task("stsb")
    ids = task_predictions(mrpc, np.array([[0.1, 0.9], [2.0, -1.0], [0.0, 3.0]], "float32"))
    np.testing.assert_array_equal(ids, [1, 0, 1])
    got = metrics.compute_metrics(mrpc, [1, 0, 0], ids)
    assert list(got) == ["f1", "accuracy"]
    assert got["accuracy"] == pytest.approx(2 / 3) and got["f1"] == pytest.approx(2 / 3)
    scores = task_predictions(stsb, np.array([0.5, 3.0, 1.0], "float32"))
    assert list(metrics.compute_metrics(stsb.to_dict(), [1.0, 4.0, 2.0], scores)) == ["pearson", "spearman"]
    with pytest.raises(ValueError, match="3 values"):
        metrics.accuracy([1, 0, 1], [1, 0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_sklearn_and_scipy(seed):
    sk = pytest.importorskip("sklearn.metrics")
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(seed)
    y, p = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    assert metrics.accuracy(y, p) == pytest.approx(sk.accuracy_score(y, p))
    assert metrics.f1(y, p) == pytest.approx(sk.f1_score(y, p))
    assert metrics.matthews(y, p) == pytest.approx(sk.matthews_corrcoef(y, p))
    y3, p3 = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
    p3[:80] = y3[:80]
    assert metrics.matthews(y3, p3) == pytest.approx(sk.matthews_corrcoef(y3, p3))
    for constant in (np.zeros(200, int), np.ones(200, int)):  # undefined cases, returned as the literal 0.0
        assert metrics.matthews(y, constant) == sk.matthews_corrcoef(y, constant) == 0.0
        assert metrics.f1(y, constant) == pytest.approx(sk.f1_score(y, constant, zero_division=0.0))
    assert metrics.f1(np.zeros(5), np.zeros(5)) == 0.0
    x = rng.normal(size=300)
    s = 0.6 * x + rng.normal(size=300)
    assert metrics.pearson(x, s) == pytest.approx(stats.pearsonr(x, s)[0], rel=1e-9)
    assert metrics.spearman(x, s) == pytest.approx(stats.spearmanr(x, s)[0], rel=1e-9)
    tied_a, tied_b = rng.integers(0, 6, 300) / 5 * 5, np.round(s * 2)  # STS-B-like scores with many ties
    np.testing.assert_allclose(metrics.rankdata(tied_a), stats.rankdata(tied_a))
    assert metrics.spearman(tied_a, tied_b) == pytest.approx(stats.spearmanr(tied_a, tied_b)[0], rel=1e-9)
    assert metrics.pearson(x, np.full(300, 2.0)) == 0.0  # undefined: reported as 0
