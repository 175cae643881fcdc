"""What ``bench/train_throughput.py`` times: the training step of three stacks, each built in its own worker process,
and, in the command's own process, the real pre-training loop (``--mode=loop``) and the optimizer update alone.

**The stacks** (``--mode=stacks``, ``--mode=profile``). ``build_step(spec)`` returns ``(step, info)``: ``step()`` runs
one full training step (forward, backward, global-norm clipping, AdamW update; dropout on) on a fixed random batch
and returns the loss as a Python float (so the work has finished when it returns); ``info`` holds the parameter
count.

* ``ours``: ``GPT1CausalLM``'s own ``train_step`` (compiled by ``gpt_tf.training.lm_objective.compile_lm`` with
  ``make_optimizer``: what ``fit`` and the command line's loop run) in a ``tf.function`` (no XLA);
* ``ours_jax``: the same model and optimizer under ``KERAS_BACKEND=jax``, compiled as pre-training on JAX compiles
  them (``compile_lm``: Keras's jit-compiled train step), one ``train_on_batch`` a step;
* ``keras_hub``: ``TokenAndPositionEmbedding`` + n × post-LN ``TransformerDecoder`` + the tied
  reverse embedding, the same loss (``lm_loss``) and a Keras AdamW in the same ``tf.function``;
* ``torch``: ``transformers.OpenAIGPTLMHeadModel`` + ``torch.optim.AdamW`` (``fused=True`` by
  default; ``torch.autocast`` for bfloat16), cross-entropy on the float32 logits.

**The loop** (``run_loop``): ``Pretrainer`` as ``python -m gpt_tf.train`` runs it, under the strategy, precision and
``--jit_compile`` given: the tf.data reader over GZIP TFRecords (of random tokens: speed does not depend on them),
``strategy.run``, gradient accumulation, the all-reduce, clipping and AdamW, dropout on; ``--warmup`` untimed steps
(default 3: tracing, XLA compilation), then ``--steps`` timed ones (default 10). MFU = tokens/s ×
``GPTConfig.flops_per_token`` / peak, the peak ``--peak_tflops`` when given (989 for an H100 SXM's dense BF16, the
datasheet figure), else the best square-matmul FLOP/s measured here in the compute dtype. On a shared CPU, "our share
of the cores" (process CPU time ÷ wall time × cores, medians) shows how much of the machine the run had.

**The optimizer update** (``run_optimizer``): one update of the ``tiny`` model's 5.2M parameters, random gradients
large enough to be clipped, one thread each, median of ``--reps`` updates after ``--warmup`` (default 3), the stacks
alternating for ``--rounds`` rounds: ``gpt_tf graph`` (``GPTAdamW.apply`` in a ``tf.function``, the training
step's update: the fused AdamW kernel where it runs, else the decoupled decay and TF's ``ResourceApplyAdam``;
``GPT_TF_FUSED_KERNELS=0`` for the latter), ``gpt_tf XLA`` (the same with ``jit_compile=True``: always the stock
ops) and ``torch fused`` (``clip_grad_norm_`` + ``torch.optim.AdamW(fused=True)``, HF Trainer's default).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import cpu_seconds, header, machine_info, measure_peak, use_speed_choices

LEARNING_RATE, WEIGHT_DECAY, CLIP_NORM = 1e-4, 0.01, 1.0
# Per-preset defaults for a 2-core CPU, sized so the default run (gpt1 + small) takes ~15 minutes.
PRESET_DEFAULTS = {
    "gpt1": {"batch": 2, "seq": 512, "warmup": 2, "steps": 3},
    "small": {"batch": 4, "seq": 256, "warmup": 3, "steps": 10},
    "tiny": {"batch": 8, "seq": 128, "warmup": 3, "steps": 10},
    "test": {"batch": 8, "seq": 32, "warmup": 3, "steps": 20},
}


def random_batch(total_vocab, batch, seq, seed=0):
    """One fixed batch of token ids ``[batch, seq + 1]`` → (inputs, next-token targets), int32 numpy."""
    import numpy as np

    ids = np.random.default_rng(seed).integers(0, total_vocab, size=(batch, seq + 1), dtype=np.int32)
    return ids[:, :-1], ids[:, 1:]


def _keras_hub_model(config):
    """The keras-hub stack of ``config``: post-LN decoders and a tied reverse embedding, built."""
    import keras
    import keras_hub

    init = keras.initializers.RandomNormal(stddev=config.init_std)

    def gelu_tanh(x):
        return keras.activations.gelu(x, approximate=True)

    class HubGPT(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.embed = keras_hub.layers.TokenAndPositionEmbedding(
                config.total_vocab, config.n_ctx, config.n_embd, tie_weights=True, embeddings_initializer=init)
            self.drop = keras.layers.Dropout(config.embd_pdrop)
            self.blocks = [keras_hub.layers.TransformerDecoder(
                intermediate_dim=config.d_ff, num_heads=config.n_head, dropout=config.resid_pdrop, activation=gelu_tanh,
                layer_norm_epsilon=config.layer_norm_epsilon, kernel_initializer=init, normalize_first=False)
                for _ in range(config.n_layer)]

        def call(self, token_ids, training=False):
            h = self.drop(self.embed(token_ids), training=training)
            for block in self.blocks:
                h = block(h, training=training)
            return self.embed.token_embedding(h, reverse=True)

    model = HubGPT(name="keras_hub_gpt")
    model(keras.ops.zeros((1, 8), "int32"))
    return model


def _tf_step(spec, config):
    """Ours (the language model's own ``train_step``: its compiled loss and ``GPTAdamW``'s update, what ``fit`` and
    the command line's loop run) or the keras-hub stack (a ``tf.function`` of its loss and Keras's AdamW): one
    training step."""
    import keras
    import numpy as np
    import tensorflow as tf

    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.nn.objectives import lm_loss
    from gpt_tf.nn.optim import make_optimizer
    from gpt_tf.training.lm_objective import compile_lm

    keras.utils.set_random_seed(0)
    mixed = spec["precision"] == "bfloat16"
    if mixed:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    inputs, targets = (tf.constant(a) for a in random_batch(config.total_vocab, spec["batch"], spec["seq"]))
    if spec["stack"] == "ours":
        use_speed_choices(config, "bfloat16" if mixed else "float32")
        model = causal_lm_for(config, dtype="mixed_bfloat16" if mixed else None)
        optimizer = make_optimizer(LEARNING_RATE, WEIGHT_DECAY, CLIP_NORM, variables=model.trainable_variables)
        compile_lm(model, optimizer, jit_compile=False)
        batch = ({"token_ids": inputs, "padding_mask": tf.ones_like(inputs)}, targets)
        step = tf.function(lambda: model.train_step(batch)["loss"])
    else:
        model = _keras_hub_model(config)
        variables = model.trainable_variables
        optimizer = keras.optimizers.AdamW(learning_rate=LEARNING_RATE, weight_decay=WEIGHT_DECAY, epsilon=1e-8,
                                           global_clipnorm=CLIP_NORM)
        optimizer.exclude_from_weight_decay(var_list=[v for v in variables if len(v.shape) < 2])
        optimizer.build(variables)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                total, count = lm_loss(model(inputs, training=True), targets)
                loss = total / count
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables, strict=True))
            return loss

    n_params = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    # The optimizer's name scope holds its ops (clipping and update): the profile's "optimizer" kind.
    return (lambda: float(step())), {"n_params": n_params, "optimizer_scope": optimizer.name}


def _jax_step(spec, config):
    """Ours on JAX (the worker runs under ``KERAS_BACKEND=jax``): the JAX route's compiled model, one
    ``train_on_batch`` per step."""
    import keras
    import numpy as np

    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.nn.optim import make_optimizer
    from gpt_tf.training.lm_objective import compile_lm

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"the ours_jax stack needs KERAS_BACKEND=jax, and Keras runs on {keras.backend.backend()}")
    keras.utils.set_random_seed(0)
    model = causal_lm_for(config, dtype="mixed_bfloat16" if spec["precision"] == "bfloat16" else None)
    compile_lm(model, make_optimizer(LEARNING_RATE, WEIGHT_DECAY, CLIP_NORM, variables=model.trainable_variables),
               jit_compile=True)
    inputs, targets = random_batch(config.total_vocab, spec["batch"], spec["seq"])
    inputs = {"token_ids": inputs, "padding_mask": np.ones_like(inputs)}
    n_params = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    return (lambda: float(model.train_on_batch(inputs, targets))), {"n_params": n_params}


def hf_config(config, **extra):
    """``transformers.OpenAIGPTConfig`` of ``config``'s shape, dropouts and init (HF maps ``afn="gelu"`` to gelu_new,
    the tanh approximation); ``extra``: more of its fields (``_finetune_stacks.HF``'s classifier head)."""
    import transformers

    return transformers.OpenAIGPTConfig(
        vocab_size=config.total_vocab, n_positions=config.n_ctx, n_embd=config.n_embd, n_layer=config.n_layer,
        n_head=config.n_head, afn="gelu", resid_pdrop=config.resid_pdrop, embd_pdrop=config.embd_pdrop,
        attn_pdrop=config.attn_pdrop, layer_norm_epsilon=config.layer_norm_epsilon, initializer_range=config.init_std,
        **extra)


def _torch_step(spec, config):
    """``transformers.OpenAIGPTLMHeadModel`` with ``torch.optim.AdamW``: one eager training step."""
    import torch
    import transformers

    torch.manual_seed(0)
    torch.set_num_threads(spec["threads"])
    if 4 * config.n_embd != config.d_ff:
        raise ValueError(f"OpenAIGPT hard-codes d_ff = 4·n_embd; preset {spec['preset']} has d_ff={config.d_ff}")
    model = transformers.OpenAIGPTLMHeadModel(hf_config(config)).train()
    params = list(model.parameters())  # the tied LM head appears once
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # "fused" (one kernel per tensor) is torch's fastest AdamW on CPU: ~5x the default loop at gpt1 size.
    kind = spec.get("torch_adamw", "fused")
    options = {"fused": {"fused": True}, "foreach": {"foreach": True}, "default": {}}[kind]
    optimizer = torch.optim.AdamW(groups, lr=LEARNING_RATE, eps=1e-8, **options)
    batch = random_batch(config.total_vocab, spec["batch"], spec["seq"])
    inputs, targets = (torch.from_numpy(a.astype("int64")) for a in batch)
    bf16 = spec["precision"] == "bfloat16"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
        optimizer.step()
        return float(loss.detach())

    return step, {"n_params": int(sum(p.numel() for p in params))}


def build_step(spec):
    """The training step of ``spec["stack"]`` for ``spec["preset"]`` at ``spec["precision"]``."""
    from gpt_tf.config import get_size

    config = get_size(spec["preset"])
    if spec.get("attn_pdrop", -1) >= 0:  # every stack alike (0: the fused attention on JAX)
        config = config.replace(attn_pdrop=spec["attn_pdrop"])
    if spec.get("pad_vocab_to", 1) > 1:  # ours alone: the peers' heads are their own
        config = config.replace(pad_vocab_to=spec["pad_vocab_to"])
    if spec["seq"] > config.n_ctx:
        raise ValueError(f"--seq={spec['seq']} exceeds n_ctx={config.n_ctx} of preset {spec['preset']}")
    if spec["stack"] == "torch":
        return _torch_step(spec, config)
    if spec["stack"] in ("ours", "keras_hub"):
        return _tf_step(spec, config)
    if spec["stack"] == "ours_jax":
        return _jax_step(spec, config)
    raise ValueError(f"unknown stack {spec['stack']!r}; choose ours, ours_jax, keras_hub or torch")


def worker_env(spec) -> dict:
    """The environment a stack's worker adds: Keras on JAX for ``ours_jax``, on ``spec["backend"]`` where given (JAX
    on ``spec["threads"]`` threads where that is not 0)."""
    backend, threads = "jax" if spec.get("stack") == "ours_jax" else spec.get("backend"), spec.get("threads")
    xla = {"XLA_FLAGS": f"--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads={threads}"}
    return {"KERAS_BACKEND": backend, **(xla if backend == "jax" and threads else {})} if backend else {}


# ----------------------------------------------------------------------------- the loop


def _write_random_records(folder: Path, vocab: int, n_ctx: int, sequences: int, seed: int = 0) -> None:
    """GZIP TFRecords of random (n_ctx + 1)-token windows and a manifest, as ``pipelines.pretrain_data`` writes."""
    import numpy as np

    from pipelines.book_stream import write_split
    from pipelines.pretrain_data import PretrainConfig
    from gpt_tf.data.records import COMPRESSION, MANIFEST

    stream = np.random.default_rng(seed).integers(0, vocab, sequences * n_ctx + 1)
    cfg = PretrainConfig(input_dir="", output_dir=str(folder), tokenizer_dir="", n_ctx=n_ctx, shard_size=sequences,
                         show_progress=False)
    shards = write_split(stream, cfg, "train", folder)
    manifest = {"n_ctx": n_ctx, "record": {"compression": COMPRESSION}, "splits": {"train": {"shards": shards}}}
    (folder / MANIFEST).write_text(json.dumps(manifest))


class _StepClock:
    """The ``TrainCallbacks`` hooks ``Pretrainer.train`` calls, keeping the time each step ended."""

    def __init__(self):
        self.ends, self.cpu = [time.perf_counter()], [cpu_seconds()]

    def on_log(self, step, stats):
        del step, stats

    def on_step_end(self, step, trainer):
        del step, trainer
        self.ends.append(time.perf_counter())
        self.cpu.append(cpu_seconds())


def _device() -> str:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        names = [tf.config.experimental.get_device_details(g).get("device_name", "GPU") for g in gpus]
        return f"{len(gpus)}× {names[0]}"
    return header(machine_info())


def run_loop(args) -> dict:
    """One row: the loop's tokens/s, ms per step and MFU, with where and how it ran."""
    from gpt_tf.console import import_tensorflow

    tf = import_tensorflow()
    import keras

    from gpt_tf.config import get_size
    from gpt_tf.strategy import make_strategy
    from gpt_tf.training.lm_objective import Pretrainer, TrainConfig

    strategy = make_strategy(args.strategy)
    if args.precision != "float32":
        keras.mixed_precision.set_dtype_policy(args.precision)
    model_config = get_size(args.model)
    use_speed_choices(model_config, "float32" if args.precision == "float32" else "bfloat16")
    total = args.warmup + args.steps + 1  # the last step also saves a checkpoint: not timed
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        _write_random_records(data, model_config.vocab_size, model_config.n_ctx, max(4 * args.batch_size, 64))
        config = TrainConfig(data_dir=str(data), run_dir=str(Path(tmp) / "run"), batch_size=args.batch_size,
                             grad_accum_steps=args.grad_accum_steps, train_steps=total, warmup_steps=1,
                             precision=args.precision, jit_compile=args.jit_compile, log_every=10**9,
                             checkpoint_every=10**9)
        trainer = Pretrainer(model_config, config, strategy, log=lambda message: None)
        clock = _StepClock()
        trainer.train(clock)
    timed = slice(args.warmup, args.warmup + args.steps)  # step k (from 1) took ends[k] - ends[k - 1]
    seconds = [b - a for a, b in zip(clock.ends[:-1], clock.ends[1:])][timed]
    cpu = [b - a for a, b in zip(clock.cpu[:-1], clock.cpu[1:])][timed]
    tokens_per_step = args.batch_size * model_config.n_ctx
    tokens_per_sec = tokens_per_step * len(seconds) / sum(seconds)
    compute_dtype = "bfloat16" if args.precision == "mixed_bfloat16" else "float32"
    peak = args.peak_tflops * 1e12 or max(v for k, v in measure_peak("tf", (1024, 2048, 4096), 3, 0, 1.0).items()
                                          if k.startswith(compute_dtype + "@"))
    flops = model_config.flops_per_token(model_config.n_ctx)
    return {
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench.train_throughput " + " ".join(sys.argv[1:]),
        "device": _device(), "replicas": strategy.num_replicas_in_sync, "tensorflow": tf.__version__,
        "model": args.model, "params": model_config.n_params, "batch": args.batch_size, "seq": model_config.n_ctx,
        "grad_accum_steps": args.grad_accum_steps, "precision": args.precision, "jit_compile": args.jit_compile,
        "strategy": args.strategy, "timed_steps": len(seconds),
        "ms_per_step_median": 1e3 * statistics.median(seconds), "tokens_per_sec": tokens_per_sec,
        "flops_per_token": flops, "peak_flops": peak, "peak_source": "given" if args.peak_tflops else "measured matmul",
        "mfu": tokens_per_sec * flops / peak,
        "cpu_s_per_step_median": statistics.median(cpu), "cores": os.cpu_count(),
        "loadavg_start_end": [load_start[0], os.getloadavg()[0]],
    }


# ----------------------------------------------------------------------------- the optimizer update


def _ours_update(jit: bool):
    import tensorflow as tf

    from gpt_tf.config import get_size
    from gpt_tf.gpt1.build import backbone_for
    from gpt_tf.nn.optim import make_optimizer

    variables = backbone_for(get_size("tiny", n_ctx=64)).trainable_variables
    grads = [tf.random.normal(v.shape, stddev=1e-2, seed=i) for i, v in enumerate(variables)]
    optimizer = make_optimizer(LEARNING_RATE, weight_decay=WEIGHT_DECAY, clip_norm=CLIP_NORM, variables=variables)
    update = tf.function(lambda g: optimizer.apply(g, variables), jit_compile=jit)

    def step():
        update(grads)
        return optimizer.iterations.numpy()  # read after the update, so it has run

    return step, variables


def _torch_fused_update(shapes):
    import torch

    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-2
    optimizer = torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, fused=True)

    def step():
        torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
        optimizer.step()

    return step


def run_optimizer(args) -> None:
    """``--mode=optimizer``: times the three updates, alternating; prints ms per update."""
    warmup = 3 if args.warmup is None else args.warmup
    import tensorflow as tf
    import torch

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    torch.set_num_threads(1)
    graph, variables = _ours_update(jit=False)
    xla, _ = _ours_update(jit=True)
    n = sum(v.shape.num_elements() for v in variables)
    shapes = [tuple(v.shape) for v in variables]
    stacks = {"gpt_tf graph": graph, "gpt_tf XLA": xla, "torch fused": _torch_fused_update(shapes)}
    times = {name: [] for name in stacks}
    for step in stacks.values():
        for _ in range(warmup):
            step()
    for _ in range(args.rounds):
        for name, step in stacks.items():
            for _ in range(args.reps):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
    print(f"{n:,} parameters, one thread; ms per update (median of {args.rounds} x {args.reps}):")
    for name, seconds in times.items():
        print(f"  {name:13s} {1000 * statistics.median(seconds):6.2f}")
