"""bench/experiments/reference_finetune.py: the PyTorch reference fine-tuning model agrees with the project's
at step 0 (task output, Eq. 5 loss, gradients) on the same batch, for each §3.3 input type; its recipe,
schedule and ledger matching. Tiny random weights and a handful of examples."""

import json
from pathlib import Path

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import tensorflow as tf  # noqa: E402

from bench.experiments import reference_finetune as rf  # noqa: E402
from bench.experiments.reference_model import ReferenceTaskModel, learning_rate, to_torch  # noqa: E402
from gpt_tf.checkpoints import build_task_models  # noqa: E402
from gpt_tf.config import GPTConfig  # noqa: E402
from gpt_tf.optim import WarmupDecay  # noqa: E402
from gpt_tf.objectives import task_loss  # noqa: E402
from pipelines.transforms import load_task_spec, special_ids_from_config, task_dataset  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BOOKS_BPE = ROOT / "gpt_tf" / "presets" / "gpt1_tiny_books_en" / "assets" / "tokenizer"  # 8,000 BPE tokens: a small token table
N_CTX = 48
TASKS = {"cola": "glue/CoLA", "rte": "glue/RTE", "stsb": "glue/STS-B", "story_cloze": "story_cloze"}


@pytest.fixture(scope="module")
def task_dirs(shared_data, tmp_path_factory):
    from pipelines import finetune_data as fd

    out = tmp_path_factory.mktemp("reference_tasks")
    for task, folder in TASKS.items():
        extra = {"holdout_fraction": 0.5} if task == "story_cloze" else {}
        fd.build_task_data(task, shared_data / folder, BOOKS_BPE, out / task, show_progress=False, max_examples=6,
                           **extra)
    return out


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The tiny model needs no thread pool; on a loaded 2-core machine torch's spinning workers only slow it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config() -> GPTConfig:
    return GPTConfig(vocab_size=8000, n_ctx=N_CTX, n_embd=32, n_layer=2, n_head=4, d_ff=128)


@pytest.mark.parametrize("task_name", sorted(TASKS))  # single, pair, pair_symmetric, multiple_choice
def test_the_reference_and_the_project_agree_at_step_0(task_dirs, task_name):
    config = _config()
    task = load_task_spec(str(task_dirs / task_name))
    keras.utils.set_random_seed(3)
    model = build_task_models(config, [task], 0.1, "float32")[0]
    ref = ReferenceTaskModel.from_project(model, 0.1).eval()  # dropout off on both sides
    features, label = next(iter(task_dataset(task, str(task_dirs / task_name), "train", 4, N_CTX,
                                             special_ids_from_config(config))))
    with tf.GradientTape() as tape:
        ours = task_loss(task, model(features, training=False, with_lm=True), features, label, 0.5)
    grad_w = tape.gradient(ours["total"], model.clf.w).numpy()
    batch, torch_label = to_torch(features, label)
    theirs = ref.losses(batch, torch_label, 0.5)
    theirs["total"].backward()

    ours_out = model(features, training=False, with_lm=False)["task"].numpy()
    np.testing.assert_allclose(theirs["out"].detach().numpy(), ours_out, atol=1e-4)
    for part in ("task", "lm", "total"):
        assert float(theirs[part].detach()) == pytest.approx(float(ours[part]), rel=1e-4, abs=1e-5), part
    np.testing.assert_allclose(ref.clf.weight.grad.numpy().T, grad_w, atol=1e-4)


def test_the_schedule_is_the_projects():
    schedule = WarmupDecay(1e-3, 5, 40, "linear")
    for step in (0, 1, 4, 5, 6, 20, 39, 40):
        assert learning_rate(step, 1e-3, 5, 40) == pytest.approx(float(schedule(step)), rel=1e-5, abs=1e-9)


def test_the_recipe_is_the_flagfiles_and_finds_the_projects_cells(tmp_path):
    recipe = rf.task_recipe("rte")  # configs/finetune_rte_tiny.flags over finetune_rte.flags over finetune_paper.flags
    assert recipe == {"n_ctx": 128, "batch_size": 32, "epochs": 3, "learning_rate": 2.5e-4, "warmup_fraction": 0.05,
                      "lm_coef": 1.0, "clf_pdrop": 0.1, "weight_decay": 0.01, "clip_norm": 1.0, "lr_decay": "linear"}
    assert rf.task_recipe("rte", epochs=10)["epochs"] == 10

    def row(seed, recipe, arm="pretrained", n_ctx=128):
        return {"task": "rte", "arm": arm, "seed": seed, "recipe": recipe, "metrics": {"dev": {"accuracy": 0.5}},
                "cmd": f"python -m gpt_tf.train --n_ctx={n_ctx} --seed={seed}"}

    same = {"learning_rate": "2.5e-4", "epochs": "3", "warmup_fraction": "0.05", "lm_coef": "1"}
    rows = [row(0, same), row(1, {**same, "lm_coef": "0.5"}), row(1, same, arm="scratch"), row(2, same, n_ctx=64),
            row(2, {k: v for k, v in same.items() if k != "lm_coef"}), row(1, same)]
    found = rf.ours_cells(json.loads(json.dumps(rows)), "rte", recipe)
    assert sorted(found) == [0, 1] and found[1]["recipe"]["lm_coef"] == "1"


def test_a_cell_run_in_pieces_ends_where_a_straight_run_ends(task_dirs, tmp_path):
    """The state saved by ``max_updates`` (weights, optimizer, dropout's random state, step) resumes exactly:
    the same batches follow the step, the same dev scores and weights come out (dropout on)."""
    recipe = {"n_ctx": N_CTX, "batch_size": 2, "epochs": 2, "learning_rate": 1e-3, "warmup_fraction": 0.2,
              "lm_coef": 0.5, "clf_pdrop": 0.1, "weight_decay": 0.01, "clip_norm": 1.0}
    common = dict(pretrained=_config(), tasks_dir=str(task_dirs), save_every=0,  # the scratch arm: a tiny model
                  log=lambda message: None)
    straight = rf.run_cell("rte", 1, recipe, state_dir=str(tmp_path / "a"), **common)
    assert rf.run_cell("rte", 1, recipe, state_dir=str(tmp_path / "b"), max_updates=4, **common) is None
    pieces = rf.run_cell("rte", 1, recipe, state_dir=str(tmp_path / "b"), **common)
    assert straight["updates"] == pieces["updates"] == 6 and len(straight["epochs"]) == 2 and pieces["arm"] == "scratch"
    assert pieces["epochs"] == straight["epochs"]
    name = rf.cell_key("rte", 1, recipe, "scratch") + ".pt"
    a, b = (torch.load(tmp_path / d / name, weights_only=False)["model"] for d in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)
