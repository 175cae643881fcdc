"""Generation speed of the family against its peers: greedy tokens/s, each stack in its own worker, one command.

    python -m bench.generation     # tiny and GPT-1 size vs transformers -> bench/results/generation_<cpu>.{json,md}
    python -m bench.generation --presets=gpt1 --weights=bfloat16,int8,int8_weight_only --new_tokens=64 \
        --threads=1 --out=bench/results/generation_weights_1thread.json   # weights in fewer bytes (and --threads=0)

One prompt of ``--prompt_tokens`` (32) continued by ``--new_tokens`` (128), at the ``--presets`` sizes (random
weights, and the context raised to hold prompt and continuation where the size's is shorter; ``tiny`` with the
shipped books weights where its 128 tokens suffice), each stack in its own worker, taking turns call by call (one
untimed call each first): ``GPT1CausalLM.generate`` (the key/value cache), its ``generate_step(use_cache=False)``
(each token runs the sequence so far), ``transformers.OpenAIGPTLMHeadModel.generate`` (``use_cache=True``,
``do_sample=False``) on the same weights, which keeps no cache (transformers' GPT-1 predates them: ``use_cache`` is
ignored), and ``GPT2LMHeadModel.generate`` of the same shape (random weights), transformers' generation with a
cache; the goal: the cache ≥ 1.5× transformers. It also reports how many generated tokens the stacks share.

``--weights=bfloat16,int8``: ours with the weights held in those formats too (``gpt_tf.gpt1.weight_formats``),
against float32, and the anchors: transformers' GPT-2 cached in bfloat16 and PyTorch's dynamic int8 of it
(``quantize_dynamic``), keras-hub's ``GPT2CausalLM`` in float32 and ``quantize("int8")``. ``--threads=0``: every core.

Prints the CPU model and features and the settings the project picks on this machine (``gpt_tf/speed/autotune.py``)
first; the workers inherit them.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median

from absl import app, flags

from bench.harness import apply_settings, cpu_slug, header, new_report, save_report

FLAGS = flags.FLAGS
STACKS = ("ours_cache", "ours_no_cache", "transformers", "transformers_gpt2")
GOAL = 1.5  # ours with the cache against transformers' generate with its cache


def define_flags():
    flags.DEFINE_string("presets", "tiny,gpt1", "model sizes (tiny: the shipped books model)")
    flags.DEFINE_integer("prompt_tokens", 32, "tokens of the prompt")
    flags.DEFINE_integer("new_tokens", 128, "tokens generated")
    flags.DEFINE_integer("rounds", 3, "timed calls per stack (after one untimed)")
    flags.DEFINE_integer("threads", 1, "threads of every stack (TF intra- and inter-op, torch intra-op; 0: every "
                         "core); one prompt's matrices are too small to share out well")
    flags.DEFINE_list("backends", [], "with --weights: ours on these Keras backends too (jax, torch), in float32 and "
                      "each format, instead of the anchors")
    flags.DEFINE_list("weights", [], "ours with weights held in these formats too (bfloat16, int8, "
                      "int8_weight_only), and the anchors in bfloat16 and int8")
    flags.DEFINE_string("out", None, "the JSON report (default bench/results/generation_<cpu>.json; .md beside it)")
    flags.DEFINE_string("worker", None, "internal: run as a worker with this JSON spec")


def _prompt(total_vocab: int, length: int) -> list:
    """``length`` token ids of a book sentence in the shipped BPE (also ids of GPT-1's size), repeated as needed."""
    from gpt_tf.convert.preset_io import SHIPPED_DIR, TOKENIZER_ASSETS
    from gpt_tf.text.tokenizer import GPTTokenizer

    tokenizer = GPTTokenizer.from_dir(str(Path(SHIPPED_DIR) / "gpt1_tiny_books_en" / TOKENIZER_ASSETS))
    ids = tokenizer.encode("the old man walked slowly into the room , looked at the fire and said nothing for a "
                           "long while , while the children waited by the door . then he sat down and began")
    return [i % total_vocab for i in (ids * (length // len(ids) + 1))[:length]]


def _ours(spec, config):
    """``GPT1CausalLM`` (the shipped weights at ``tiny``): a greedy generation of ``spec`` per call."""
    import numpy as np
    import tensorflow as tf

    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.convert.preset_io import SHIPPED_DIR, load_preset_weights

    lm = causal_lm_for(config)
    if spec["weights"] == "shipped":
        load_preset_weights(lm.backbone, str(Path(SHIPPED_DIR) / "gpt1_tiny_books_en"))
    if spec.get("format", "float32") != "float32":
        from gpt_tf.gpt1.weight_formats import with_weights

        lm = with_weights(lm, spec["format"])
    lm.use_sampler("greedy")
    total, prompt = spec["prompt_tokens"] + spec["new_tokens"], spec["prompt"]
    ids = np.zeros((1, total), np.int32)
    ids[0, : len(prompt)] = prompt
    inputs = {"token_ids": ids, "padding_mask": np.arange(total)[None, :] < len(prompt)}
    if spec["stack"].startswith("ours_cache"):  # the Python API's generate (keras-hub's tf.function of generate_step)
        return lm, lambda: lm.generate(inputs, stop_token_ids=None)["token_ids"][0]
    step = tf.function(lambda x: lm.generate_step(x, use_cache=False)["token_ids"])
    return lm, lambda: step(inputs).numpy()[0]


def _transformers(spec, config, state=None):
    """``OpenAIGPTLMHeadModel.generate`` (greedy, ``use_cache=True``) with ``state``'s weights; without ``state``,
    ``GPT2LMHeadModel`` of the same shape (random weights), whose ``generate`` has a key/value cache."""
    import torch
    import transformers

    if spec["threads"]:  # 0: torch's default, every core
        torch.set_num_threads(spec["threads"])
    shape = dict(vocab_size=config.vocab_size, n_positions=config.n_ctx, n_embd=config.n_embd, n_layer=config.n_layer,
                 n_head=config.n_head, layer_norm_epsilon=config.layer_norm_epsilon)
    if state is None:
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**shape, activation_function="gelu_new"))
    else:
        model = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(**shape, afn="gelu"))
        missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
        if unexpected or [k for k in missing if not k.endswith(".attn.bias")]:
            raise ValueError(f"weights do not fit transformers' model: missing {missing}, unexpected {unexpected}")
    model = model.float().eval()
    if spec.get("format") == "bfloat16":
        model = model.to(torch.bfloat16)
    elif spec.get("format") == "int8":  # PyTorch's dynamic int8 of every Linear (GPT-2's projections are Conv1D)
        model = torch.ao.quantization.quantize_dynamic(_gpt2_linear(model), {torch.nn.Linear}, dtype=torch.qint8)
    prompt = torch.tensor([spec["prompt"]])

    def generate():
        with torch.inference_mode():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=spec["new_tokens"],
                                 min_new_tokens=spec["new_tokens"], do_sample=False, use_cache=True, pad_token_id=0)
        return out[0].numpy()

    return generate


def _gpt2_linear(model):
    """``model`` (transformers' GPT-2) with its ``Conv1D`` projections as ``torch.nn.Linear`` (the same weights,
    transposed), so ``quantize_dynamic`` finds them."""
    import torch
    from transformers.pytorch_utils import Conv1D

    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, Conv1D):
                linear = torch.nn.Linear(child.weight.shape[0], child.weight.shape[1])
                linear.weight.data, linear.bias.data = child.weight.data.t().contiguous(), child.bias.data
                setattr(module, child_name, linear)
    return model


def _keras_hub(spec, config):
    """keras-hub's ``GPT2CausalLM`` of the same shape (random weights; ``format`` int8: ``quantize("int8")``)."""
    import keras
    import keras_hub
    import numpy as np

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=config.vocab_size, num_layers=config.n_layer,
                                             num_heads=config.n_head, hidden_dim=config.n_embd,
                                             intermediate_dim=config.d_ff, max_sequence_length=config.n_ctx)
    lm = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    if spec.get("format") == "int8":
        lm.quantize("int8")
    lm.compile(sampler="greedy")
    total, prompt = spec["prompt_tokens"] + spec["new_tokens"], spec["prompt"]
    ids = np.zeros((1, total), np.int32)
    ids[0, : len(prompt)] = prompt
    inputs = {"token_ids": ids, "padding_mask": np.arange(total)[None, :] < len(prompt)}
    return lambda: lm.generate(inputs, stop_token_ids=None)["token_ids"][0]


class Generate:
    """GPT-1's size, random weights: ``evaluate()`` is one greedy ``generate`` with the key/value cache of
    ``new_tokens`` after a 32-token prompt (this module's ``ours_cache``; ``bench.costs --mode=gpt1``'s generation)."""

    def __init__(self, spec):
        import keras

        from gpt_tf.config import get_size

        if spec["precision"] != "float32":
            keras.mixed_precision.set_dtype_policy(spec["precision"])
        config, self.new_tokens = get_size("gpt1"), spec["new_tokens"]
        stack = {"stack": "ours_cache", "weights": "random", "prompt": _prompt(config.vocab_size, 32),
                 "prompt_tokens": 32, "new_tokens": self.new_tokens}
        self.run = _ours(stack, config)[1]
        self.info = {"n_params": config.n_params}

    def evaluate(self) -> dict:
        self.run()
        return {"examples": self.new_tokens}


def generate_worker(spec) -> None:
    """Worker: builds its stack, then one timed generation per ``step`` line; answers the tokens it generated."""
    import numpy as np
    import tensorflow as tf

    from bench.train_throughput import serve_steps
    from gpt_tf.config import get_size

    if spec["threads"]:
        tf.config.threading.set_intra_op_parallelism_threads(spec["threads"])
        tf.config.threading.set_inter_op_parallelism_threads(spec["threads"])
        if spec.get("backend") == "torch":
            import torch

            torch.set_num_threads(spec["threads"])
    config = get_size(spec["preset"], n_ctx=spec["n_ctx"])
    if spec["stack"] == "transformers":  # the same weights: ours, as transformers' state dict
        from gpt_tf.convert.state_dicts import to_hf_state_dict

        run = _transformers(spec, config, to_hf_state_dict(_ours({**spec, "stack": "ours_cache"}, config)[0]))
    elif spec["stack"].startswith("transformers_gpt2"):
        run = _transformers(spec, config)
    elif spec["stack"].startswith("keras_hub"):
        run = _keras_hub(spec, config)
    else:
        run = _ours(spec, config)[1]
    serve_steps(run, {"n_params": config.n_params},
                lambda ids: {"tokens": np.asarray(ids)[spec["prompt_tokens"]:].tolist()})


def generation(preset: str, log) -> dict:
    """The stacks' calls at ``preset``, taking turns (``train_throughput.run_group``; one untimed call each first):
    tokens/s (median), ratios, shared tokens, each format against the same stack in float32."""
    from bench.train_throughput import run_group
    from gpt_tf.config import get_size

    config = get_size(preset)
    total = FLAGS.prompt_tokens + FLAGS.new_tokens  # a longer context than the size's: its shape, random weights
    shipped = preset == "tiny" and total <= config.n_ctx
    base = {"preset": preset, "prompt_tokens": FLAGS.prompt_tokens, "new_tokens": FLAGS.new_tokens,
            "n_ctx": max(total, config.n_ctx), "weights": "shipped" if shipped else "random",
            "threads": FLAGS.threads, "prompt": _prompt(config.vocab_size, FLAGS.prompt_tokens),
            "warmup": 1, "steps": FLAGS.rounds}  # the first call traces / warms up: not timed
    stacks = {stack: "float32" for stack in STACKS}
    if FLAGS.weights:  # the formats against float32's cached stacks (the uncached ones are the default run's)
        stacks = {"ours_cache": "float32", "transformers_gpt2": "float32"}
        stacks.update({f"ours_cache_{w}": w for w in FLAGS.weights})
        if FLAGS.backends:  # Keras's own arithmetic of each format on JAX and PyTorch, against their float32
            del stacks["transformers_gpt2"]
            stacks.update({f"ours_cache_{b}{f'_{w}' if w != 'float32' else ''}": w
                           for b in FLAGS.backends for w in ["float32", *FLAGS.weights]})
        else:
            stacks.update({"transformers_gpt2_bfloat16": "bfloat16", "transformers_gpt2_int8": "int8",
                           "keras_hub_gpt2": "float32", "keras_hub_gpt2_int8": "int8"})
    backend_of = {s: b for s in stacks for b in FLAGS.backends if s.startswith(f"ours_cache_{b}")}
    specs = [{**base, "stack": stack, "format": w, "backend": backend_of.get(stack)} for stack, w in stacks.items()]
    calls = {row["stack"]: row["steps_log"] for row in run_group(specs, 1.0, FLAGS.rounds, log,
                                                                 module="bench.generation")}
    rows = {stack: {"tokens_per_s": base["new_tokens"] / median([c["s"] for c in got]),
                    "others_cpu_share": median([c["others_cpu_share"] for c in got])} for stack, got in calls.items()}
    tokens = {stack: got[-1]["tokens"] for stack, got in calls.items()}
    shared = {f"ours_cache = {other}": sum(map(int.__eq__, tokens["ours_cache"], tokens[other])) / len(tokens[other])
              for other in stacks if other in ("ours_no_cache", "transformers") or other.startswith("ours_cache_")}
    pairs = [(f"ours_cache_{w}", "ours_cache") for w in FLAGS.weights] + [
        (s, s.rsplit("_", 1)[0]) for s in stacks if s.endswith(("_bfloat16", "_int8")) and not s.startswith("ours")] + [
        (f"ours_cache_{b}_{w}", f"ours_cache_{b}") for b in FLAGS.backends for w in FLAGS.weights]
    formats = {stack: median([b["s"] / c["s"] for b, c in zip(calls[float32], calls[stack])])  # paired by round
               for stack, float32 in pairs}
    result = {"preset": preset, "n_ctx": base["n_ctx"], "weights": base["weights"], "rows": rows,
              "same_tokens": shared, "vs_float32": formats, "threads": FLAGS.threads}
    if "transformers_gpt2" in rows:
        result["cache_vs_gpt2_cache"] = rows["ours_cache"]["tokens_per_s"] / rows["transformers_gpt2"]["tokens_per_s"]
    if "transformers" in rows:
        result["cache_vs_transformers"] = rows["ours_cache"]["tokens_per_s"] / rows["transformers"]["tokens_per_s"]
        result["no_cache_vs_transformers"] = (rows["ours_no_cache"]["tokens_per_s"]
                                              / rows["transformers"]["tokens_per_s"])
    return result


def same_generations(preset: str, formats: list, prompts: list, new_tokens: int = 32) -> dict:
    """The share of greedily generated tokens (``new_tokens`` after each prompt) the same as float32's, per format."""
    import numpy as np

    import gpt_tf
    from gpt_tf.gpt1.weight_formats import with_weights

    lm, ids = gpt_tf.GPT1CausalLM.from_preset(preset), {}
    for name in formats:
        model = lm if name == "float32" else with_weights(lm, name)
        model.compile(sampler="greedy")
        x = model.preprocessor.generate_preprocess(prompts, sequence_length=64)
        lengths = np.asarray(x["padding_mask"]).sum(-1)
        out = np.asarray(model.make_generate_function()(x, stop_token_ids=None)["token_ids"])
        ids[name] = [row[n:n + new_tokens] for row, n in zip(out, lengths)]
    return {name: float(np.mean([np.mean(a == b) for a, b in zip(ids[name], ids["float32"])])) for name in formats}


def generation_markdown(report: dict) -> str:
    legacy = [g for g in report["generation"] if "cache_vs_transformers" in g]  # without --weights
    lines = ["```bash", report["command"], "```", "", f"Measured {report['date']}: {report['header']}.", "",
             f"Settings picked by the project: {report['settings']}", ""]
    lines += [] if not legacy else [
             f"Greedy generation, one prompt of {FLAGS.prompt_tokens} tokens continued by {FLAGS.new_tokens}; "
             f"tokens/s, the median of {FLAGS.rounds} calls per stack, the stacks taking turns, "
             f"{FLAGS.threads} thread(s) each:", "",
             "| size (context, weights) | ours, cache | ours, no cache | transformers | GPT-2 shape, cached "
             "| cache / transformers | no cache / transformers | cache / GPT-2 cached "
             "| tokens shared (cache = no cache; = transformers) | others' CPU |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for g in legacy:
        r = g["rows"]
        others = median([row["others_cpu_share"] for row in r.values()])
        rates = " | ".join(f"{r[s]['tokens_per_s']:,.1f}" for s in STACKS)
        lines.append(f"| {g['preset']} ({g['n_ctx']}, {g['weights']}) | {rates}"
                     + f" | **{g['cache_vs_transformers']:.2f}×** | {g['no_cache_vs_transformers']:.2f}× "
                     + f"| {g['cache_vs_gpt2_cache']:.2f}× | "
                     + "; ".join(f"{v:.0%}" for v in g["same_tokens"].values()) + f" | {100 * others:.0f}% |")
    lines += [] if not legacy else [
              "", "transformers' `OpenAIGPTLMHeadModel` keeps no key/value cache (its `generate` ignores `use_cache`: "
              "each token runs the sequence so far, as ours without the cache); `GPT2LMHeadModel` of the same shape "
              "(pre-LN, random weights) is transformers' generation with a cache.", "",
              f"Goal: the cache ≥ {GOAL}× transformers: " + ", ".join(
        f"{g['preset']} {'met' if g['cache_vs_transformers'] >= GOAL else 'missed'}"
        for g in legacy) + "."]
    for g in report["generation"]:  # --weights: each format against the same stack's float32
        if g.get("vs_float32"):
            same = {k.split(" = ")[1]: v for k, v in g["same_tokens"].items()}
            lines += ["", f"Greedy generation, {FLAGS.prompt_tokens} prompt tokens + {FLAGS.new_tokens}, the median "
                      f"of {FLAGS.rounds} calls per stack taking turns; {g['preset']} ({g['n_ctx']}, "
                      f"{g['weights']} weights), weights in fewer bytes, "
                      f"{g['threads'] or 'all'} thread(s): tokens/s (median) and × the same stack in float32 (the "
                      "median of the rounds' ratios); tokens the same as ours in float32:", "",
                      "| stack | tokens/s | × float32 | same tokens | others' CPU |", "|---|---:|---:|---:|---:|"]
            lines += [f"| {s} | {r['tokens_per_s']:,.1f} | {g['vs_float32'].get(s, 1.0):.2f}× | "
                      f"{f'{same[s]:.0%}' if s in same else ''} | {100 * r['others_cpu_share']:.0f}% |"
                      for s, r in g["rows"].items() if s not in ("ours_no_cache", "transformers")]
    return "\n".join(lines) + "\n"


def main(argv):
    del argv  # everything is a flag
    if FLAGS.worker:
        return generate_worker(json.loads(FLAGS.worker))
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    report = new_report("bench.generation", "minutes")
    report["header"] = header(report["machine"])
    log(report["header"])
    report["settings"] = apply_settings()  # before any worker starts: they inherit the settings
    log(report["settings"])
    out = Path(FLAGS.out or f"bench/results/generation_{cpu_slug(report['machine'])}.json")
    report["generation"] = []
    for preset in FLAGS.presets.split(","):  # saved after each size: a run cut short keeps what it measured
        report["generation"].append(generation(preset, log))
        save_report(report, generation_markdown(report), out, log)


if __name__ == "__main__":
    define_flags()
    app.run(main)
