"""Length-bucketed fine-tuning batches (gpt_tf/data/task_batches.py): same losses, every record once, seeded,
resumable, the same global batches on any number of replicas. Their CLI runs end to end (kill -9 at an epoch's
end + resume, two mirrored replicas = one device) are in tests/test_finetune_loop.py, sharing its runs.

Task data are slices of the real SST-2, RTE, STS-B and Story Cloze files with GPT-1's BPE.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.config import get_size
from gpt_tf.tasks import get_task
from pipelines import finetune_data as fd
from gpt_tf.data import transforms
from gpt_tf.data.task_batches import bucket_lengths, epoch_plan

SPECIAL = {"start": 40478, "delimiter": 40479, "extract": 40480, "pad": 40481}
TASKS = {"sst2": ("glue/SST-2", {"max_examples": 64}), "rte": ("glue/RTE", {"max_examples": 40}),
         "stsb": ("glue/STS-B", {"max_examples": 40}),
         "story_cloze": ("story_cloze", {"max_examples": 60, "holdout_fraction": 0.3})}


@pytest.fixture(scope="module")
def built(shared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("buckets")
    for task, (folder, options) in TASKS.items():
        fd.build_task_data(task, shared_data / folder, shared_data / "gpt1_bpe", out / task, show_progress=False,
                           **options)
    return out


def dataset(built, task, split, batch=8, n_ctx=64, **kwargs):
    return transforms.task_dataset(get_task(task), str(built / task), split, batch, n_ctx, SPECIAL, **kwargs)


def serialized(built, task, split):
    path = built / task / fd.record_file(split)
    return [s for s in tf.data.TFRecordDataset(str(path), compression_type="GZIP")]


@pytest.mark.parametrize("task", list(TASKS))
def test_record_length_is_the_longest_view_after_truncation(built, task):
    records = serialized(built, task, "train")
    for n_ctx in (24, 64):  # 24: some views are truncated
        lengths = transforms.record_lengths(get_task(task), tf.stack(records), n_ctx).numpy()
        views = [transforms.transform_record(get_task(task), transforms.parse_record(s), n_ctx, SPECIAL)[0]
                 for s in records]
        assert lengths.tolist() == [int(v["extract_index"].numpy().max()) + 1 for v in views]


def bucket_of(length, buckets):
    return min(b for b in buckets if b >= length)


def test_training_epochs_see_every_record_once_in_bucketed_seeded_batches():
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.geometric(0.08, size=203) + 2, 128).astype(np.int32)
    buckets, batch = bucket_lengths(128), 8
    assert buckets == (8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128)
    assert bucket_lengths(128, per_octave=1) == (8, 16, 32, 64, 128)
    plans = {(seed, epoch): [t.numpy() for t in epoch_plan(lengths, buckets, batch, epoch, seed, training=True)]
             for seed in (0, 1) for epoch in (0, 1)}
    for (index, length) in plans.values():
        assert index.shape == (203 // batch, batch)
        assert len(set(index.ravel())) == index.size  # once each; 203 mod 8 = 3 sit the epoch out
        assert all(n == bucket_of(lengths[row].max(), buckets) for row, n in zip(index, length))
        straddling = sum(bucket_of(lengths[row].min(), buckets) != n for row, n in zip(index, length))
        assert straddling <= len(buckets) - 1  # at most one run per bucket border is padded further
        assert np.mean(length) < 0.6 * 128  # mostly short: most of the padding to n_ctx is gone
    again = epoch_plan(lengths, buckets, batch, 1, 0, training=True)[0].numpy()
    assert np.array_equal(again, plans[0, 1][0])  # seeded: the same (seed, epoch) gives the same batches
    assert not np.array_equal(plans[0, 0][0], plans[0, 1][0]) and not np.array_equal(plans[0, 0][0], plans[1, 0][0])
    left_out = [set(range(203)) - set(plans[0, e][0].ravel()) for e in (0, 1)]
    assert len(left_out[0]) == 3 and left_out[0] != left_out[1]


def test_evaluation_sees_every_record_once_in_file_order_per_bucket():
    lengths = np.array([40, 5, 70, 20, 9, 33, 12, 100, 17, 8, 64], np.int32)
    index, length = (t.numpy() for t in epoch_plan(lengths, (16, 32, 64, 128), 4, 0, 0, training=False))
    assert index.tolist() == [[1, 4, 6, 9], [3, 8, 0, 5], [10, 2, 7, -1]]  # -1: a ghost row fills the last batch
    assert length.tolist() == [16, 64, 128]


@pytest.mark.parametrize("task", ["sst2", "story_cloze"])
@pytest.mark.parametrize("pipelines, replicas", [(1, 2), (2, 2), (2, 4)])
def test_every_replica_gets_its_slice_of_the_same_global_batch(built, task, pipelines, replicas):
    whole = [(f["input_ids"].shape[-1], f["record_index"].numpy()) for f, _ in
             dataset(built, task, "train", training=True, seed=3).take(6)]
    parts = [list(dataset(built, task, "train", training=True, seed=3,
                          input_context=tf.distribute.InputContext(pipelines, p, replicas)).take(6 * replicas // pipelines))
             for p in range(pipelines)]
    local = replicas // pipelines
    for step, (length, index) in enumerate(whole):
        slices = [parts[p][step * local + r][0] for p in range(pipelines) for r in range(local)]
        assert {s["input_ids"].shape[-1] for s in slices} == {length}  # one bucket for all replicas of a step
        assert np.concatenate([s["record_index"].numpy() for s in slices]).tolist() == index.tolist()


def test_resuming_at_a_batch_replays_the_stream_from_there(built):
    stream = [f["record_index"].numpy().tolist() for f, _ in dataset(built, "sst2", "train", training=True).take(20)]
    for start in (5, 8, 13):  # 64 records / 8 = 8 batches per epoch: mid-epoch, at a border, in epoch 2
        resumed = dataset(built, "sst2", "train", training=True, start_batch=start).take(20 - start)
        assert [f["record_index"].numpy().tolist() for f, _ in resumed] == stream[start:]
    for epoch in (stream[:8], stream[8:16]):
        assert sorted(sum(epoch, [])) == list(range(64))  # every record exactly once per epoch


INPUTS = ("input_ids", "extract_index", "lm_weights")  # the task model's inputs among a batch's features


def per_example_losses(model, task, features, label):
    """(task loss, the sum of its views' mean LM losses) per example: what the training loss averages (L2 over the
    examples, L1 over the views, each view's own mean over its real next tokens)."""
    from gpt_tf.gpt1.backbone import token_inputs

    task_out = tf.cast(model({k: features[k] for k in INPUTS}, training=False), tf.float32)
    if task.head == "regression":
        task_l = tf.square(task_out - label)
    else:
        task_l = keras.losses.sparse_categorical_crossentropy(label, task_out, from_logits=True)
    ids = features["input_ids"]
    rows = tf.reshape(ids, [-1, tf.shape(ids)[-1]])  # every view a row
    logits = model.backbone.embed.logits(model.backbone(token_inputs(rows)))  # the tied LM head, every position
    lm = keras.losses.sparse_categorical_crossentropy(rows[:, 1:], logits[:, :-1, :], from_logits=True)
    weights = tf.reshape(features["lm_weights"], tf.shape(rows))[:, :-1]
    per_view = tf.reduce_sum(lm * weights, -1) / tf.maximum(tf.reduce_sum(weights, -1), 1.0)
    return task_l.numpy(), tf.reduce_sum(tf.reshape(per_view, tf.shape(ids)[:2]), -1).numpy()


def padded_to(features, length):
    """The model's inputs of a batch padded further, to ``length``: pad tokens, weight 0."""
    extra = length - features["input_ids"].shape[-1]
    return {"input_ids": np.pad(features["input_ids"].numpy(), ((0, 0), (0, 0), (0, extra)),
                                constant_values=SPECIAL["pad"]),
            "extract_index": features["extract_index"].numpy(),
            "lm_weights": np.pad(features["lm_weights"].numpy(), ((0, 0), (0, 0), (0, extra)))}


@pytest.mark.parametrize("task", list(TASKS))
def test_bucketed_epoch_gives_the_padded_losses_and_views_share_a_bucket(built, task):
    from gpt_tf.gpt1.backbone import GPT1Backbone
    from gpt_tf.gpt1.text_classifier import task_for_spec

    spec = get_task(task)
    keras.utils.set_random_seed(0)
    config = get_size("test", vocab_size=40478, n_ctx=64, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
    model = task_for_spec(GPT1Backbone.from_gpt_config(config), spec, dropout=0.0, compile=True)
    losses, per_epoch = {}, transforms.num_examples(str(built / task), "train") // 8
    trained = []  # (a bucketed batch's training loss, the same batch's padded to n_ctx)
    for buckets in (None, (64,)):
        got = {}
        for features, label in dataset(built, task, "train", training=True, seed=5, buckets=buckets).take(per_epoch):
            ids, extract = features["input_ids"].numpy(), features["extract_index"].numpy()
            # Every view of every example keeps its <e> inside the batch's bucket: K views, one length.
            assert (np.take_along_axis(ids, extract[..., None], -1)[..., 0] == SPECIAL["extract"]).all()
            # ... and the batch is padded to the bucket of its longest view, or to n_ctx without buckets.
            assert ids.shape[-1] == (64 if buckets else bucket_of(extract.max() + 1, bucket_lengths(64)))
            for i, t, lm in zip(features["record_index"].numpy(), *per_example_losses(model, spec, features, label)):
                got[int(i)] = (t, lm)
            if buckets is None and len(trained) < 2 and ids.shape[-1] < 64:  # the model's own loss (L2 + λ·L1)
                x = {k: features[k] for k in INPUTS}
                trained.append([float(model.compute_loss(f, label, model(f, training=True)))
                                for f in (x, padded_to(features, 64))])
        losses[buckets] = got
    bucketed, padded = losses[None], losses[(64,)]
    assert sorted(bucketed) == sorted(padded) and len(bucketed) == per_epoch * 8  # one epoch: the same records
    for i in bucketed:
        np.testing.assert_allclose(bucketed[i], padded[i], rtol=1e-5, atol=1e-5)
    assert trained
    for bucket_loss, full_loss in trained:  # the training loss does not see the padding either
        np.testing.assert_allclose(bucket_loss, full_loss, rtol=1e-5)


def test_predictions_come_back_in_file_order(built, tmp_path):
    from gpt_tf.training.task_objective import FinetuneConfig, Finetuner

    spec = get_task("story_cloze")
    config = get_size("test", vocab_size=40478, n_ctx=64)
    outs = {}
    for buckets in (True, False):
        ft = FinetuneConfig(data_dir=str(built / "story_cloze"), run_dir=str(tmp_path / str(buckets)), batch_size=4,
                            length_buckets=buckets)
        outs[buckets] = Finetuner(spec, config, ft, tf.distribute.get_strategy(), log=lambda m: None).predict("dev")
    labels = [int(transforms.parse_record(s)["label"]) for s in serialized(built, "story_cloze", "dev")]
    assert outs[True][1].tolist() == outs[False][1].tolist() == labels
    np.testing.assert_allclose(outs[True][0], outs[False][0], rtol=1e-5, atol=1e-5)
