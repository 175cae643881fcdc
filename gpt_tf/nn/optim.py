"""Optimisation as in §4.1: Adam with decoupled weight decay, warm-up then cosine (or linear) decay.

* Weight decay 0.01 on every weight matrix (rank ≥ 2, embeddings included, as the release's
  ``len(p.get_shape()) > 1`` rule); none on biases and layer-norm gains/biases.
* Learning rate: linear warm-up from 0 over ``warmup_steps`` updates, then cosine (pre-training)
  or linear (fine-tuning) annealing to 0 at ``total_steps``.
* Gradient clipping by global norm (``clip_norm``).

``GPTAdamW`` is what ``fit`` and the command line's loop both apply (the model's ``train_step``): on TensorFlow it
sums the replicas' gradients once and clips that sum, so clipping sees the true global norm under any
``tf.distribute`` strategy, and runs its update in the fused kernel where that runs. On JAX and PyTorch it is
Keras's AdamW with the same decay rule, clipping by Keras's own ``global_clipnorm``: the same arithmetic, by
Keras's ops.
"""

from __future__ import annotations

import contextlib
import math
import threading

import keras
from keras import ops

from gpt_tf import backend

from gpt_tf.speed import kernels
from gpt_tf.nn.layers import PACKAGE


@keras.saving.register_keras_serializable(package=PACKAGE)
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to ``peak`` over ``warmup_steps``, then ``cosine`` or ``linear`` decay to 0."""

    def __init__(self, peak, warmup_steps, total_steps, decay="cosine"):
        if decay not in ("cosine", "linear", "constant"):
            raise ValueError(f"lr decay must be 'cosine', 'linear' or 'constant', got {decay!r}")
        if total_steps <= 0 or warmup_steps < 0 or warmup_steps > total_steps:
            raise ValueError(f"need 0 <= warmup_steps ({warmup_steps}) <= total_steps ({total_steps}) and total_steps > 0")
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warm = float(max(self.warmup_steps, 1))
        ramp = self.peak * ops.minimum(step / warm, 1.0) if self.warmup_steps else ops.convert_to_tensor(self.peak)
        frac = (step - self.warmup_steps) / max(self.total_steps - self.warmup_steps, 1)
        frac = ops.clip(frac, 0.0, 1.0)
        if self.decay == "cosine":
            decayed = self.peak * 0.5 * (1.0 + ops.cos(math.pi * frac))
        elif self.decay == "linear":
            decayed = self.peak * (1.0 - frac)
        else:
            decayed = ops.convert_to_tensor(self.peak)
        return ops.where(step < self.warmup_steps, ramp, decayed)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps, "decay": self.decay}


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPTAdamW(keras.optimizers.AdamW):
    """Keras AdamW with the paper's decay rule (weight matrices only) and global-norm clipping (``clip_norm``), on
    every backend (see the module doc).

    The arithmetic is Keras AdamW's: ``var -= lr·wd·var``; ``m += (g - m)(1 - β1)``;
    ``v += (g² - v)(1 - β2)``; ``var -= lr·sqrt(1 - β2^t)/(1 - β1^t) · m / (sqrt(v) + ε)``. Decay applies to every
    variable of rank ≥ 2 (the release's ``len(p.get_shape()) > 1`` rule), so the optimizer needs no variable list
    before Keras builds it (``fit`` on any trainable set: ``enable_lora`` after ``compile`` included).

    On TensorFlow, inside a ``tf.distribute`` replica, the update sums the replicas' gradients once, clips them to the
    global norm of that sum (Keras would clip each replica's before its own all-reduce) and runs in one pass over
    var, m, v and the gradient in gpt_tf's fused kernel (``gpt_tf.speed.kernels``) where that runs, else in TF's
    ``ResourceApplyAdam`` after a separate decay. On JAX and PyTorch, Keras's own update with ``global_clipnorm``.
    ``global_norm`` holds the last update's gradient norm before clipping. With ``gradient_accumulation_steps`` the
    learning-rate schedule counts updates, not micro-batches.
    """

    def __init__(self, *args, clip_norm=None, **kwargs):
        tensorflow = backend.on_tensorflow()
        kwargs.pop("global_clipnorm", None)
        if clip_norm and not tensorflow:  # Keras's apply() clips there; on TensorFlow _backend_update_step does
            kwargs["global_clipnorm"] = clip_norm
        super().__init__(*args, **kwargs)
        self.clip_norm = clip_norm or None
        self.tensorflow_update = tensorflow  # the all-reduce, the clipping and the fused kernel of TensorFlow
        # The clipping factor of the update being traced, for the fused kernel (`_backend_update_step` sets it,
        # `_update_scalars` reads it). Per thread: MirroredStrategy traces its replicas in parallel threads.
        self._trace_state = threading.local()

    def build(self, variables):
        super().build(variables)
        self.global_norm = self.add_variable((), initializer="zeros", dtype="float32", name="global_norm",
                                             aggregation="only_first_replica")

    def _use_weight_decay(self, variable):
        return len(variable.shape) >= 2 and super()._use_weight_decay(variable)

    def _get_current_learning_rate(self):
        steps = self.gradient_accumulation_steps
        if steps and isinstance(self._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return self._learning_rate(self.iterations)  # updates, where Keras's schedules read micro-batches
        return super()._get_current_learning_rate()

    def _clip_gradients(self, grads):
        if self.tensorflow_update:  # after the all-reduce, in _backend_update_step
            return grads
        if self.clip_norm:
            self.global_norm.assign(ops.sqrt(ops.sum(ops.stack([ops.sum(ops.square(g)) for g in grads]))))
        return super()._clip_gradients(grads)

    def _backend_apply_gradients(self, grads, trainable_variables):
        if self.tensorflow_update:  # a gather's IndexedSlices summed per row: accumulation and the norm need them
            tf = backend.tf
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
            last = getattr(self._trace_state, "last_micro_batch", None)
            if self.gradient_accumulation_steps and last is not None:
                return self._accumulate_or_update(grads, trainable_variables, last)
        return super()._backend_apply_gradients(grads, trainable_variables)

    @contextlib.contextmanager
    def micro_batch(self, last: bool):
        """The ``apply`` traced inside (TensorFlow, ``gradient_accumulation_steps``) accumulates the gradients (``last``
        False) or updates with the accumulated mean (``last`` True), as chosen here when traced rather than by Keras's
        ``ops.cond`` on the micro-batch count: tf.distribute cannot run the update's collectives (the all-reduce, the
        distributed update's merge_call) inside a cond. The command line's loop, whose micro-batches are unrolled,
        traces each inside this (``gpt_tf.training.loop``)."""
        self._trace_state.last_micro_batch = bool(last)
        try:
            yield
        finally:
            self._trace_state.last_micro_batch = None

    def _accumulate_or_update(self, grads, variables, last: bool):
        """Keras's gradient accumulation (``BaseOptimizer._backend_apply_gradients``), its branch chosen when traced
        (``micro_batch``)."""
        accumulated = [self._accumulated_gradients[self._get_variable_index(v)] for v in variables]
        if not last:
            self._backend_increment_gradient_accumulators(grads, accumulated)
            return
        steps = self.gradient_accumulation_steps
        grads = self._clip_gradients([(g + a) / steps for g, a in zip(grads, accumulated)])
        self._apply_weight_decay(variables)
        self._backend_update_step(grads, variables, self.learning_rate)
        self._backend_reset_gradient_accumulators()

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return list(grads_and_vars)  # summed once, before the clipping (_backend_update_step)

    def _reduce_and_clip(self, grads):
        """TensorFlow: the gradients summed over the replicas (one all-reduce), their global norm (kept in
        ``global_norm``), and the clipping: by the fused update as it reads each gradient (its factor), or here,
        only when the norm is over ``clip_norm`` (``tf.clip_by_global_norm`` multiplies every gradient otherwise)."""
        tf = backend.tf
        grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, list(grads))
        norm = tf.linalg.global_norm(grads)
        self.global_norm.assign(norm)
        factor = None
        if self.clip_norm and kernels.graph_ops() is not None:
            factor = clip_factor(norm, self.clip_norm)
        elif self.clip_norm:
            grads = tf.cond(norm > self.clip_norm,
                            lambda: tf.clip_by_global_norm(grads, self.clip_norm, use_norm=norm)[0],
                            lambda: [tf.identity(g) for g in grads])
        return grads, factor

    def get_config(self):
        config = super().get_config()
        config.pop("global_clipnorm", None)
        return {**config, "clip_norm": self.clip_norm}

    def _apply_weight_decay(self, variables):
        """On TensorFlow, folded into ``update_step``; elsewhere Keras's."""
        if not self.tensorflow_update:
            super()._apply_weight_decay(variables)

    def _update_scalars(self, learning_rate) -> dict:
        """The update's scalars: computed once per update, not once per variable (for `tiny`'s 52
        variables that was ~270 more tiny graph ops per step, each costing the executor a few µs). TensorFlow's."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        step = tf.cast(self.iterations + 1, tf.float32)  # updates (Keras counts accumulated micro-batches as one)
        lr = tf.cast(learning_rate, tf.float32)
        beta_1, beta_2 = tf.constant(self.beta_1, tf.float32), tf.constant(self.beta_2, tf.float32)
        scalars = {"lr": lr, "decay": lr * (self.weight_decay or 0.0), "beta_1": beta_1, "beta_2": beta_2,
                   "beta1_power": tf.pow(beta_1, step), "beta2_power": tf.pow(beta_2, step),
                   "epsilon": tf.constant(self.epsilon, tf.float32)}
        if kernels.graph_ops() is not None:  # not inside XLA functions; decided here, once per traced update
            # The fused kernel's [alpha, decay, β1, β2, ε, gradient factor], alpha as ResourceApplyAdam
            # computes it; the factor is the clipping's (`_reduce_and_clip`), 1 where nothing clips.
            alpha = lr * tf.sqrt(1.0 - scalars["beta2_power"]) / (1.0 - scalars["beta1_power"])
            factor = getattr(self._trace_state, "grad_factor", None)
            factor = tf.constant(1.0) if factor is None else factor
            packed = [alpha, scalars["decay"], beta_1, beta_2, scalars["epsilon"], factor]
            scalars["fused"], scalars["fused_no_decay"] = tf.stack(packed), tf.stack([*packed[:1], 0.0 * lr, *packed[2:]])
        return scalars

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not self.tensorflow_update:
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        grads, self._trace_state.grad_factor = self._reduce_and_clip(grads)
        try:
            # The scalars are computed in the replica context and handed on where Keras hands on the learning rate:
            # under MirroredStrategy they become per-replica values, and each variable's update on each device
            # receives that device's (`update_step`'s third argument).
            return super()._backend_update_step(grads, trainable_variables, self._update_scalars(learning_rate))
        finally:
            self._trace_state.grad_factor = None

    def update_step(self, gradient, variable, scalars):
        """One variable's update; ``scalars`` come from `_update_scalars` (via `_backend_update_step`); on JAX and
        PyTorch, Keras's AdamW update with ``scalars`` the learning rate."""
        if not self.tensorflow_update:
            return super().update_step(gradient, variable, scalars)
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        if variable.dtype != tf.float32:
            raise TypeError(f"{variable.name}: GPTAdamW updates float32 variables, got {variable.dtype}")
        decayed = bool(self.weight_decay) and self._use_weight_decay(variable)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index].value, self._velocities[index].value
        if "fused" in scalars:  # `_update_scalars` found the kernel usable in this traced function
            grad = gradient if gradient.dtype in (tf.float32, tf.bfloat16) else tf.cast(gradient, tf.float32)
            kernels.fused_adamw(variable, m, v, grad, scalars["fused" if decayed else "fused_no_decay"])
            return
        if decayed:
            variable.assign_sub(variable * scalars["decay"])
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=m.handle, v=v.handle, beta1_power=scalars["beta1_power"],
            beta2_power=scalars["beta2_power"], lr=scalars["lr"], beta1=scalars["beta_1"], beta2=scalars["beta_2"],
            epsilon=scalars["epsilon"], grad=tf.cast(gradient, tf.float32), use_locking=False,
        )


def clip_factor(norm, clip_norm):
    """What ``tf.clip_by_global_norm(grads, clip_norm, use_norm=norm)`` multiplies the gradients by where
    ``norm > clip_norm`` (NaN where the norm is infinite), else 1: `GPTAdamW`'s clipping."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    clipped = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm)
    return tf.where(norm > clip_norm, tf.where(tf.math.is_finite(norm), clipped, float("nan")), 1.0)


def make_optimizer(learning_rate, weight_decay=0.01, clip_norm=1.0, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                   gradient_accumulation_steps=None, variables=None):
    """The paper's AdamW (§4.1: decay on weight matrices only, clipping at the global norm); built on ``variables``
    when given (a checkpoint can then hold its slots before the first update), else by Keras at the first one."""
    optimizer = GPTAdamW(learning_rate=learning_rate, weight_decay=weight_decay, beta_1=beta_1, beta_2=beta_2,
                         epsilon=epsilon, clip_norm=clip_norm if clip_norm and clip_norm > 0 else None,
                         gradient_accumulation_steps=gradient_accumulation_steps if gradient_accumulation_steps and
                         gradient_accumulation_steps > 1 else None)
    if variables is not None:
        optimizer.build(variables)
    return optimizer
