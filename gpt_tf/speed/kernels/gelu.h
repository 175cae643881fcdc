// gpt_tf's fused tanh GELU and its gradient (gpt_tf/speed/kernels/__init__.py: fused_gelu).
#pragma once
#include "common.h"

namespace gpt_tf {

// The tanh GELU of the GPT-1 release, 0.5 x (1 + tanh(k (x + a x^3))), computed in float32 and
// returned in x's dtype; and its gradient dy * d/dx, from x (one pass each: TensorFlow's graph runs
// about 8 element-wise kernels forward and 12 backward, plus casts around them under bfloat16).
constexpr float kK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kA = 0.044715f;

REGISTER_OP("GptGelu").Input("x: T").Output("y: T").Attr("T: {float, bfloat16}").SetShapeFn(SameShapeAsInput0);
REGISTER_OP("GptGeluGrad")
    .Input("dy: T")
    .Input("x: T")
    .Output("dx: T")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn(SameShapeAsInput0);

template <typename T>
class GeluOp : public OpKernel {
 public:
  explicit GeluOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    Tensor* y = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    auto xf = x.flat<T>().template cast<float>();
    y->flat<T>().device(ctx->eigen_device<CPUDevice>()) =
        (0.5f * xf * (1.0f + (kK * (xf + kA * xf * xf * xf)).tanh())).template cast<T>();
  }
};

template <typename T>
class GeluGradOp : public OpKernel {
 public:
  explicit GeluGradOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& dy = ctx->input(0);
    const Tensor& x = ctx->input(1);
    OP_REQUIRES(ctx, dy.shape().IsSameSize(x.shape()),
                ::tensorflow::errors::InvalidArgument("GptGeluGrad: dy ", dy.shape().DebugString(), " and x ",
                                                      x.shape().DebugString(), " differ"));
    Tensor* dx = nullptr;  // in dy's buffer where nothing else holds dy (no fresh pages to touch)
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, x.shape(), &dx));
    auto xf = x.flat<T>().template cast<float>();
    auto dyf = dy.flat<T>().template cast<float>();
    auto t = (kK * (xf + kA * xf * xf * xf)).tanh();
    dx->flat<T>().device(ctx->eigen_device<CPUDevice>()) =
        (dyf * (0.5f * (1.0f + t) + 0.5f * xf * (1.0f - t * t) * kK * (1.0f + 3.0f * kA * xf * xf)))
            .template cast<T>();
  }
};

GPT_TF_REGISTER_CPU("GptGelu", GeluOp)
GPT_TF_REGISTER_CPU("GptGeluGrad", GeluGradOp)

}  // namespace gpt_tf
