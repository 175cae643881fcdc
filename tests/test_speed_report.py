"""The speed reports' bookkeeping: which stacks are evaluated and how the goals are read from a run's rows."""

from bench import finetune_speed, harness, speed_table


def test_eval_stacks_evaluates_one_stack_per_lambda_twin():
    # The default set: the λ = 0.5 stack of each precision, keras fit, HF.
    assert finetune_speed.eval_stacks(finetune_speed.DEFAULT_STACKS) == [
        "ours_padded", "ours_bucketed", "keras_fit", "ours_bucketed_bf16", "hf_float32", "hf_bfloat16"]
    # bench.speed_table's set has no λ = 0.5 stack: its λ = 0 stacks must be evaluated (a run of this set once
    # ended in a KeyError, evaluating nothing of ours).
    assert finetune_speed.eval_stacks(["ours_bucketed_lm0", "hf_float32"]) == ["ours_bucketed_lm0", "hf_float32"]
    # --mode=ab's workers are named base and this, not stacks of STACKS, and run one spec (it once ended in a
    # KeyError before its first round).
    spec = {"task_dir": "t", **finetune_speed.STACKS["ours_bucketed_lm0"]}
    assert finetune_speed.eval_stacks({"base": spec, "this": spec}) == ["base"]


def _measure(examples_per_s):
    return {"examples_per_s": examples_per_s, "examples_per_cpu_s": examples_per_s, "others_cpu_share": 0.0}


def test_goals_of_a_lambda0_only_run():
    logs = {"ours_bucketed_lm0": {"train": [_measure(150.0)], "eval": [_measure(450.0)]},
            "hf_float32": {"train": [_measure(100.0)], "eval": [_measure(300.0)]}}
    summary = finetune_speed.summarise(logs)
    assert summary["ratios"]["train ours_bucketed_lm0 / best HF (hf_float32) (goal >= 1.5)"] == 1.5
    assert summary["ratios"]["eval ours_bucketed_lm0 / best HF (hf_float32) (goal >= 1.5)"] == 1.5
    goals = speed_table.goals({"pretraining": [], "finetuning": {"summary": summary}})
    assert [(what, round(ratio, 2)) for what, ratio, _ in goals] == [
        ("fine-tuning train: ours_bucketed_lm0 / hf_float32", 1.5),
        ("fine-tuning eval: ours_bucketed_lm0 / hf_float32", 1.5)]


def test_keras_fit_against_hf_is_read_from_its_own_rows():
    logs = {"keras_fit": {"train": [_measure(80.0)], "eval": [_measure(330.0)]},
            "keras_fit_lm0": {"train": [_measure(160.0)], "eval": []},
            "hf_float32": {"train": [_measure(100.0)], "eval": [_measure(300.0)]}}
    ratios = finetune_speed.summarise(logs)["ratios"]
    assert ratios["train keras fit λ=0 (keras_fit_lm0) / best HF (hf_float32) (goal >= 1.5)"] == 1.6
    assert ratios["eval keras predict / best HF (hf_float32) (goal >= 1.5)"] == 1.1


def test_the_speed_table_goals_file_name_and_table():
    info = {"cpu": "AMD EPYC 9B45", "isa": ["avx2", "fma", "avx512f", "avx512_bf16"]}
    assert harness.cpu_slug(info) == "amd_epyc_9b45_avx512_bf16"
    rows = [{"preset": "tiny", "stack": s, "precision": "float32", "tokens_per_s": t, "batch": 8, "seq": 128,
             "others_cpu_share": 0.5, "vs_keras_hub": 1.5, "vs_torch": 3.0}
            for s, t in (("ours", 300.0), ("keras_hub", 200.0), ("torch", 100.0))]
    report = {"pretraining": rows, "finetuning": {"summary": {"rows": {
        "ours_bucketed_lm0": {"train": 150.0, "eval": 400.0, "others_cpu_share": 0.1},
        "hf_float32": {"train": 100.0, "eval": 400.0, "others_cpu_share": 0.1}}}}}
    assert [(what.split(":")[0], round(r, 2), g) for what, r, g in speed_table.goals(report)] == [
        ("pre-training tiny", 1.5, 1.25), ("pre-training tiny", 3.0, 1.5), ("fine-tuning train", 1.5, 1.5),
        ("fine-tuning eval", 1.0, 1.5)]
    report.update(command="python -m bench.speed_table", date="2026-11-26T01:00+00:00", header="AMD EPYC",
                  settings="settings auto: ...", goals=speed_table.goals(report))
    table = speed_table.markdown(report)
    assert "| tiny | float32 | 8 × 128 | 300 | 200 | 100 | 1.50× | 3.00× | 50% |" in table
    assert "| fine-tuning eval: ours_bucketed_lm0 / hf_float32 | 1.00× | ≥ 1.5× | no |" in table
