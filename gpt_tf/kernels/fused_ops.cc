// gpt_tf's fused CPU kernels (see gpt_tf/kernels/__init__.py): one pass over memory where TensorFlow's
// graph makes several. Built by gpt_tf/kernels/build.py against the installed TensorFlow.
#define EIGEN_USE_THREADS

#include <cmath>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/training_op_helpers.h"
#include "tensorflow/core/util/work_sharder.h"

namespace gpt_tf {

using ::tensorflow::bfloat16;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using CPUDevice = Eigen::ThreadPoolDevice;

::absl::Status SameShapeAsInput0(::tensorflow::shape_inference::InferenceContext* c) {
  c->set_output(0, c->input(0));
  return ::absl::OkStatus();
}

// AdamW as Keras computes it, in one pass over var, m, v and grad (TensorFlow's ResourceApplyAdam plus
// a separate decay take three: decay product, decay subtraction, Adam):
//   var -= decay * var                    (decay = lr * weight_decay; 0 for biases and gains)
//   m += (g - m) * (1 - beta1);  v += (g * g - v) * (1 - beta2)
//   var -= alpha * m / (sqrt(v) + epsilon)  (alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t))
// scalars = [alpha, decay, beta1, beta2, epsilon]; grad is float32 or bfloat16 (read as float32).
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
    OP_REQUIRES(ctx, scalars.NumElements() == 5,
                ::tensorflow::errors::InvalidArgument("GptFusedAdamW: scalars must hold 5 values, got ",
                                                      scalars.NumElements()));
    const float* s = scalars.flat<float>().data();
    const float alpha = s[0], decay = s[1], one_minus_b1 = 1.0f - s[2], one_minus_b2 = 1.0f - s[3], eps = s[4];
    float* pw = var.flat<float>().data();
    float* pm = m.flat<float>().data();
    float* pv = v.flat<float>().data();
    const G* pg = grad.flat<G>().data();
    auto update = [=](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float g = static_cast<float>(pg[i]);
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

#define GPT_TF_REGISTER(T)                                                                                  \
  REGISTER_KERNEL_BUILDER(Name("GptFusedAdamW").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),   \
                          FusedAdamWOp<T>);                                                                 \
  REGISTER_KERNEL_BUILDER(Name("GptGelu").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), GeluOp<T>); \
  REGISTER_KERNEL_BUILDER(Name("GptGeluGrad").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),     \
                          GeluGradOp<T>);
GPT_TF_REGISTER(float)
GPT_TF_REGISTER(bfloat16)
#undef GPT_TF_REGISTER

}  // namespace gpt_tf
