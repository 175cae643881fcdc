// gpt_tf's fused AdamW (gpt_tf/speed/kernels/__init__.py: fused_adamw).
#pragma once
#include "common.h"

namespace gpt_tf {

// AdamW as Keras computes it, in one pass over var, m, v and grad (TensorFlow's ResourceApplyAdam plus
// a separate decay take three: decay product, decay subtraction, Adam):
//   var -= decay * var                    (decay = lr * weight_decay; 0 for biases and gains)
//   m += (g - m) * (1 - beta1);  v += (g * g - v) * (1 - beta2)
//   var -= alpha * m / (sqrt(v) + epsilon)  (alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t))
// with g = grad * factor (the gradient clipping's factor, 1 where nothing clips; no pass of its own).
// scalars = [alpha, decay, beta1, beta2, epsilon, factor]; grad is float32 or bfloat16 (read as float32).
REGISTER_OP("GptFusedAdamW")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("grad: T")
    .Input("scalars: float")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

template <typename G>
class FusedAdamWOp : public OpKernel {
 public:
  explicit FusedAdamWOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    auto locks = ::tensorflow::MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(ctx, true, false, {0, 1, 2});
    Tensor var, m, v;
    OP_REQUIRES_OK(ctx, ::tensorflow::GetInputTensorFromVariable<CPUDevice, float>(ctx, 0, true, false, &var));
    OP_REQUIRES_OK(ctx, ::tensorflow::GetInputTensorFromVariable<CPUDevice, float>(ctx, 1, true, false, &m));
    OP_REQUIRES_OK(ctx, ::tensorflow::GetInputTensorFromVariable<CPUDevice, float>(ctx, 2, true, false, &v));
    const Tensor& grad = ctx->input(3);
    const Tensor& scalars = ctx->input(4);
    OP_REQUIRES(ctx, var.shape().IsSameSize(m.shape()) && var.shape().IsSameSize(v.shape()) &&
                         var.shape().IsSameSize(grad.shape()),
                ::tensorflow::errors::InvalidArgument("GptFusedAdamW: var ", var.shape().DebugString(), ", m ",
                                                      m.shape().DebugString(), ", v ", v.shape().DebugString(),
                                                      " and grad ", grad.shape().DebugString(), " differ"));
    OP_REQUIRES(ctx, scalars.NumElements() == 6,
                ::tensorflow::errors::InvalidArgument("GptFusedAdamW: scalars must hold 6 values, got ",
                                                      scalars.NumElements()));
    const float* s = scalars.flat<float>().data();
    const float alpha = s[0], decay = s[1], one_minus_b1 = 1.0f - s[2], one_minus_b2 = 1.0f - s[3], eps = s[4],
                factor = s[5];
    float* pw = var.flat<float>().data();
    float* pm = m.flat<float>().data();
    float* pv = v.flat<float>().data();
    const G* pg = grad.flat<G>().data();
    auto update = [=](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float g = static_cast<float>(pg[i]) * factor;
        const float mi = pm[i] + (g - pm[i]) * one_minus_b1;
        const float vi = pv[i] + (g * g - pv[i]) * one_minus_b2;
        pm[i] = mi;
        pv[i] = vi;
        const float w = pw[i] - pw[i] * decay;
        pw[i] = w - (mi * alpha) / (std::sqrt(vi) + eps);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, var.NumElements(), /*cost_per_unit=*/20, update);
  }
};

GPT_TF_REGISTER_CPU("GptFusedAdamW", FusedAdamWOp)

}  // namespace gpt_tf
