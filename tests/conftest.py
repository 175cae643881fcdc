"""Shared pytest fixtures."""

import os
from pathlib import Path

import pytest

# The suite runs with the default speed choices: nothing measured (gpt_tf/speed/resolve.py) in any command it starts,
# so that it stays deterministic and fast; tests/test_autotune.py drives the measuring's logic with fake timings.
os.environ["GPT_TF_AUTOTUNE"] = "0"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to ../shared/data (the project's real data, beside the repository).

    Skips the test when it is absent, except in CI (CI=true), where its absence is a failure.
    """
    path = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    if not path.is_dir():
        message = f"shared data folder not found at {path}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (required when CI=true)")
        pytest.skip(message)
    return path


# The groups that take longest, longest first (their tests' total time under `--durations=0` in a clean-clone run of
# the whole suite, 2026-11-27; refresh it when that list changes much).
# Under `--dist loadgroup --no-loadscope-reorder` (scripts/test.sh) a free worker takes the next group in
# the collection's order, so these start first and the last groups handed out are short ones. Without it
# xdist orders the groups by their number of tests: the walk-through (2 tests, ~6 min) and the hot-swap
# test (1) came last, both on one worker (it takes the next group while its current one has 2 tests to
# go), while the other worker had nothing left to do.
LONGEST_FIRST = ("serving_e2e", "test_walkthrough", "test_gpt1_harness", "test_finetune_loop", "test_train",
                 "test_gpt1_presets_cli", "test_backends", "test_finetune", "test_tokenizer", "test_scale",
                 "test_server_hardening", "test_serving_ab", "test_jax_distribution", "test_jax_pretrain",
                 "test_torch_pretrain", "test_disk_faults", "test_gpt1_family", "test_fuzz_serving",
                 "test_hot_swap_memory", "test_hf_checkpoint", "test_buckets")


# The numerics-sensitive tests: they compare floats TensorFlow computes, against a reference, between two computation
# paths (within small_runs.TWO_PATHS), or bit for bit where that is the point (resuming). TensorFlow turns oneDNN's
# rewrites on by itself on CPUs with AVX-512's neural-network instructions and leaves them off on the others (AVX2-only
# CPUs such as an AMD Zen 3); the two modes round differently. scripts/test.sh runs these tests a second time with the
# rewrites in the mode this CPU does not default to (TF_ENABLE_ONEDNN_OPTS flipped), so every run also sees what the
# other CPU kinds compute. An entry is a whole file, or `file::test` (every parametrisation) where the rest of a heavy
# file compares no floats. tests/test_suite_order.py checks that every entry still names a test.
NUMERICS = (
    "test_model", "test_task_model", "test_weights", "test_gpt1_fit", "test_gpt1_presets_cli", "test_gpt1_batching",
    "test_kernels", "test_inference_gelu", "test_aliased_grads", "test_lstm", "test_torch_lstm", "test_optim",
    "test_backends", "test_vocab_padding",
    "test_gpt1_family::test_predict_on_texts_computes_what_the_model_computes_on_their_features",
    "test_gpt1_family::test_task_presets_round_trip_with_identical_logits",
    "test_gpt1_family::test_the_loops_language_model_starts_from_a_preset",
    "test_gpt1_family::test_release_shards_and_runs_convert_to_presets",
    "test_gpt1_family::test_regression_and_multiple_choice_fit_and_predict",
    "test_zero_shot::test_scorer_equals_numpy_log_probs",
    "test_hf_checkpoint::test_lm_logits_equal_transformers_on_the_same_folder",
    "test_hf_checkpoint::test_pytorch_model_bin_gives_the_same_weights_and_transformers_logits",
    "test_finetune_loop::test_kill_9_then_resume_gives_bit_identical_weights",
    "test_finetune_loop::test_kill_9_mid_epoch_then_resume_gives_bit_identical_weights",
    "test_finetune_loop::test_sigterm_saves_exits_143_and_the_same_command_resumes_to_the_same_weights",
    "test_finetune_loop::test_grad_accum_2_gives_the_full_batch_update",
    "test_finetune_loop::test_two_mirrored_replicas_equal_one_device",
    "test_train::test_kill_9_then_same_command_resumes_to_identical_weights",
    "test_train::test_same_update_as_default_strategy_full_batch",
    "test_scale::test_jit_compile_and_accumulation_give_the_full_batch_update",
)


def is_numerics(item) -> bool:
    """Whether a collected test is one of NUMERICS (its file, or its file and function)."""
    return item.path.stem in NUMERICS or f"{item.path.stem}::{item.originalname}" in NUMERICS


@pytest.fixture
def fresh_choices(monkeypatch, tmp_path):
    """``fresh_choices()``: a fresh folder for the measured choices' cache files (``XDG_CACHE_HOME``), and this
    process's speed choices (``gpt_tf.speed.choices``) restored after the test; returns the folder."""

    def fresh():
        from gpt_tf.speed import choices

        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
        monkeypatch.setattr(choices, "_current", [])
        return tmp_path

    return fresh


def xdist_group(path: Path) -> str:
    """A test file's group: tests/serving_e2e/ as a whole, any other file on its own."""
    return "serving_e2e" if path.parent.name == "serving_e2e" else path.stem


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`scripts/test.sh`: two workers, ``--dist loadgroup``), a test file runs whole on
    one worker (its module fixtures are built once) and tests/serving_e2e/ runs whole on one (its package
    fixtures, the exported models and the server, cost minutes); the groups in LONGEST_FIRST come first, in
    that order, the others in the order collected. Runs before xdist reads the groups. The tests marked ``slow``
    are deselected unless ``-m`` names them (``-m slow``; the numerics run's ``-m numerics`` does not)."""
    if config is not None and "slow" not in (config.getoption("markexpr", "") or ""):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    rank = {group: i for i, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(xdist_group(item.path), len(rank)))  # stable: files stay together
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group(item.path)))
        if is_numerics(item):
            item.add_marker(pytest.mark.numerics)
