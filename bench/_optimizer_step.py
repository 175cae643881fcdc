"""``bench.train_throughput --mode=optimizer``: one optimizer update of the `tiny` model's 5.2M parameters, timed
alone: ours against HF's default.

    python -m bench.train_throughput --mode=optimizer        # ~1 min; prints ms per update

Same parameter shapes (the `tiny` backbone's trainable variables), random gradients large enough to be
clipped, one thread each, median of ``--reps`` updates after ``--warmup`` (default 3), the stacks alternating
for ``--rounds`` rounds:

    gpt_tf graph   ``GPTAdamW.clip_and_apply`` in a ``tf.function``: the update the training loop runs
                   (global-norm clip, then gpt_tf's fused AdamW kernel where it runs, else the decoupled
                   decay and TF's fused ``ResourceApplyAdam``; ``GPT_TF_FUSED_KERNELS=0`` for the latter)
    gpt_tf XLA     the same function with ``jit_compile=True`` (always the stock ops: XLA cannot compile
                   the kernel)
    torch fused    ``clip_grad_norm_`` + ``torch.optim.AdamW(fused=True)``: HF Trainer's default
                   ``adamw_torch_fused``
"""

from __future__ import annotations

import statistics
import time

from absl import flags


def define_flags():
    """``--reps`` and ``--rounds`` (``--warmup`` is ``bench.train_throughput``'s)."""
    flags.DEFINE_integer("reps", 30, "--mode=optimizer: timed updates per stack and round")
    flags.DEFINE_integer("rounds", 3, "--mode=optimizer: rounds, each stack in turn")


def ours(jit: bool):
    import tensorflow as tf

    from gpt_tf.config import get_size
    from gpt_tf.gpt1.build import backbone_for
    from gpt_tf.optim import make_optimizer

    variables = backbone_for(get_size("tiny", n_ctx=64)).trainable_variables
    grads = [tf.random.normal(v.shape, stddev=1e-2, seed=i) for i, v in enumerate(variables)]
    optimizer = make_optimizer(variables, 1e-4, weight_decay=0.01, clip_norm=1.0)
    update = tf.function(lambda g: optimizer.clip_and_apply(g, variables), jit_compile=jit)
    return lambda: update(grads).numpy(), sum(v.shape.num_elements() for v in variables)


def torch_fused(shapes):
    import torch

    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-2
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=True)

    def step():
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    return step


def main(args) -> None:
    warmup = 3 if args.warmup is None else args.warmup
    import tensorflow as tf
    import torch

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    torch.set_num_threads(1)
    graph, n = ours(jit=False)
    xla, _ = ours(jit=True)
    from gpt_tf.config import get_size
    from gpt_tf.gpt1.build import backbone_for

    shapes = [tuple(v.shape) for v in backbone_for(get_size("tiny", n_ctx=64)).trainable_variables]
    stacks = {"gpt_tf graph": graph, "gpt_tf XLA": xla, "torch fused": torch_fused(shapes)}
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

