// gpt_tf's fused CPU kernels (see gpt_tf/kernels/__init__.py): one pass over memory where TensorFlow's
// graph makes several. Built by gpt_tf/kernels/build.py against the installed TensorFlow.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

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

// Layer norm over the last axis (Keras LayerNormalization's float32 arithmetic), forward and gradient in
// one pass over each row, vectorised across the row (the graph takes ~15 ops forward, ~30 backward):
//   y = (x - mean) * rstd * gamma + beta,  rstd = 1 / sqrt(var + epsilon)       (mean, rstd kept per row)
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * gamma,  xhat = (x - mean) * rstd
//   dgamma = sum over rows of dy * xhat,  dbeta = sum over rows of dy
REGISTER_OP("GptLayerNorm")
    .Input("x: T")
    .Input("gamma: float")
    .Input("beta: float")
    .Output("y: T")
    .Output("mean: float")
    .Output("rstd: float")
    .Attr("epsilon: float")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->Subshape(c->input(0), 0, -1, &rows));
      c->set_output(0, c->input(0));
      c->set_output(1, rows);
      c->set_output(2, rows);
      return ::absl::OkStatus();
    });
REGISTER_OP("GptLayerNormGrad")
    .Input("dy: T")
    .Input("x: T")
    .Input("gamma: float")
    .Input("mean: float")
    .Input("rstd: float")
    .Output("dx: T")
    .Output("dgamma: float")
    .Output("dbeta: float")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(2));
      c->set_output(2, c->input(2));
      return ::absl::OkStatus();
    });

// Element conversions the compiler vectorises: bfloat16 is the high half of a float32; float32 to
// bfloat16 rounds to nearest even, NaN to the quiet NaN (as Eigen's conversion does).
inline float ToFloat(float x) { return x; }
inline float ToFloat(bfloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(Eigen::numext::bit_cast<uint16_t>(x)) << 16;
  return Eigen::numext::bit_cast<float>(bits);
}
inline void Store(float f, float* out) { *out = f; }
inline void Store(float f, bfloat16* out) {
  const uint32_t u = Eigen::numext::bit_cast<uint32_t>(f);
  const uint32_t rounded = (f != f) ? 0x7fc00000u : u + 0x7fffu + ((u >> 16) & 1u);
  *out = Eigen::numext::bit_cast<bfloat16>(static_cast<uint16_t>(rounded >> 16));
}

// Checks that x [..., d] ends in gamma's [d]; sets d and the number of rows.
bool CheckRows(OpKernelContext* ctx, const char* op, const Tensor& x, const Tensor& gamma, int64_t* d, int64_t* rows) {
  if (!(x.dims() >= 1 && gamma.dims() == 1 && x.dim_size(x.dims() - 1) == gamma.dim_size(0))) {
    ctx->CtxFailure(::tensorflow::errors::InvalidArgument(op, ": x ", x.shape().DebugString(),
                                                          " does not end in gamma's ", gamma.shape().DebugString()));
    return false;
  }
  *d = gamma.dim_size(0);
  *rows = *d ? x.NumElements() / *d : 0;
  return true;
}

::tensorflow::TensorShape RowShape(const Tensor& x) {
  ::tensorflow::TensorShape rows(x.shape());
  rows.RemoveLastDims(1);
  return rows;
}

// The sum of term(i) for i < n in 16 interleaved partial sums: vectorised, in a fixed order (the compiler
// may not reorder a single float sum itself).
template <typename F>
inline float LaneSum(int64_t n, F term) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] += term(i + j);
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += term(i);
  for (int j = 0; j < kLanes; ++j) sum += lanes[j];
  return sum;
}

// One row of the layer norm: y = (x - mean) * rstd * gamma + beta, with c (d floats) as scratch. The
// pointers are __restrict parameters, so the loops vectorise without run-time alias checks.
template <typename T>
void NormaliseRow(int64_t d, float eps, const T* __restrict x, const float* __restrict gamma,
                  const float* __restrict beta, float* __restrict c, T* __restrict y, float* mean, float* rstd) {
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t i = 0; i < d; ++i) c[i] = ToFloat(x[i]);
  const float m = LaneSum(d, [c](int64_t i) { return c[i]; }) * inv_d;
  for (int64_t i = 0; i < d; ++i) c[i] -= m;
  const float rs = 1.0f / std::sqrt(LaneSum(d, [c](int64_t i) { return c[i] * c[i]; }) * inv_d + eps);
  for (int64_t i = 0; i < d; ++i) Store(c[i] * rs * gamma[i] + beta[i], y + i);
  *mean = m;
  *rstd = rs;
}

// One row of the gradient; adds the row's dy * xhat and dy to dgamma and dbeta. xhat and g (d floats each)
// are scratch. dx may be dy's buffer, so it is not __restrict: the row of dy is read whole before dx is written.
template <typename T>
void NormaliseRowGrad(int64_t d, float m, float rs, const T* __restrict x, const T* __restrict dy,
                      const float* __restrict gamma, float* __restrict xhat, float* __restrict g,
                      float* __restrict dgamma, float* __restrict dbeta, T* dx) {
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t i = 0; i < d; ++i) {
    const float n = (ToFloat(x[i]) - m) * rs, dyi = ToFloat(dy[i]);
    xhat[i] = n;
    g[i] = dyi * gamma[i];
    dgamma[i] += dyi * n;
    dbeta[i] += dyi;
  }
  const float mean_g = LaneSum(d, [g](int64_t i) { return g[i]; }) * inv_d;
  const float mean_gx = LaneSum(d, [g, xhat](int64_t i) { return g[i] * xhat[i]; }) * inv_d;
  for (int64_t i = 0; i < d; ++i) Store(rs * (g[i] - mean_g - xhat[i] * mean_gx), dx + i);
}

template <typename T>
class LayerNormOp : public OpKernel {
 public:
  explicit LayerNormOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, c->GetAttr("epsilon", &eps_)); }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    int64_t d, rows;
    if (!CheckRows(ctx, "GptLayerNorm", x, ctx->input(1), &d, &rows)) return;
    Tensor *y = nullptr, *mean = nullptr, *rstd = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, RowShape(x), &mean));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, RowShape(x), &rstd));
    const T* px = x.flat<T>().data();
    T* py = y->flat<T>().data();
    const float* gamma = ctx->input(1).flat<float>().data();
    const float* beta = ctx->input(2).flat<float>().data();
    float* pm = mean->flat<float>().data();
    float* pr = rstd->flat<float>().data();
    const float eps = eps_;
    auto normalise = [=](int64_t begin, int64_t end) {
      std::vector<float> scratch(d);
      for (int64_t r = begin; r < end; ++r) {
        NormaliseRow(d, eps, px + r * d, gamma, beta, scratch.data(), py + r * d, pm + r, pr + r);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, rows, /*cost_per_unit=*/8 * d, normalise);
  }

 private:
  float eps_;
};

template <typename T>
class LayerNormGradOp : public OpKernel {
 public:
  explicit LayerNormGradOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& dy = ctx->input(0);
    const Tensor& x = ctx->input(1);
    const Tensor& gamma_t = ctx->input(2);
    int64_t d, rows;
    if (!CheckRows(ctx, "GptLayerNormGrad", x, gamma_t, &d, &rows)) return;
    OP_REQUIRES(ctx, dy.shape() == x.shape() && ctx->input(3).NumElements() == rows && ctx->input(4).NumElements() == rows,
                ::tensorflow::errors::InvalidArgument("GptLayerNormGrad: dy ", dy.shape().DebugString(), ", x ",
                                                      x.shape().DebugString(), ", mean ",
                                                      ctx->input(3).shape().DebugString(), " and rstd ",
                                                      ctx->input(4).shape().DebugString(), " do not match"));
    Tensor *dx = nullptr, *dgamma = nullptr, *dbeta = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, x.shape(), &dx));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, gamma_t.shape(), &dgamma));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, gamma_t.shape(), &dbeta));
    // dgamma and dbeta sum over rows: each block of rows sums into its own [2, d] slot, added up after.
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(workers->num_threads, rows / 16));
    Tensor partial;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, ::tensorflow::TensorShape({blocks, 2, d}), &partial));
    const T* pdy = dy.flat<T>().data();
    const T* px = x.flat<T>().data();
    T* pdx = dx->flat<T>().data();  // may be dy's buffer (see NormaliseRowGrad)
    const float* gamma = gamma_t.flat<float>().data();
    const float* pm = ctx->input(3).flat<float>().data();
    const float* pr = ctx->input(4).flat<float>().data();
    float* pp = partial.flat<float>().data();
    auto backward = [=](int64_t first_block, int64_t end_block) {
      std::vector<float> scratch(2 * d);
      for (int64_t b = first_block; b < end_block; ++b) {
        float* sums = pp + b * 2 * d;  // [dgamma, dbeta] of this block's rows
        std::fill(sums, sums + 2 * d, 0.0f);
        for (int64_t r = rows * b / blocks; r < rows * (b + 1) / blocks; ++r) {
          NormaliseRowGrad(d, pm[r], pr[r], px + r * d, pdy + r * d, gamma, scratch.data(), scratch.data() + d, sums,
                           sums + d, pdx + r * d);
        }
      }
    };
    ::tensorflow::Shard(blocks, workers->workers, blocks, /*cost_per_unit=*/12 * d * (rows / blocks + 1), backward);
    float* pdg = dgamma->flat<float>().data();
    float* pdb = dbeta->flat<float>().data();
    std::copy(pp, pp + d, pdg);  // block 0's sums ...
    std::copy(pp + d, pp + 2 * d, pdb);
    for (int64_t b = 1; b < blocks; ++b) {  // ... plus the others'
      for (int64_t i = 0; i < d; ++i) {
        pdg[i] += pp[b * 2 * d + i];
        pdb[i] += pp[b * 2 * d + d + i];
      }
    }
  }
};

// Dropout as gpt_tf.layers.Dropout16 computes it, mask and all, in one pass (the graph: TF's
// StatelessRandomUniformFullIntV2, a bitcast, a slice, a compare, a product and a select):
//   draws = the int16 halves (low half first) of the uint32 Philox4x32-10 stream of TF's stateless
//           ops for (key, counter) from StatelessRandomGetKeyCounter; element e takes draw e
//   keep  = draw >= threshold;  y = keep ? x * scale : 0  (scale rounded to x's dtype first, as the graph)
// and its gradient dx = keep ? dy * scale : 0. The Philox rounds run 16 counters at a time (vectorised);
// the stream is TF's to the bit (tests/test_kernels.py compares masks with the graph's).
REGISTER_OP("GptDropout")
    .Input("x: T")
    .Input("key: uint64")
    .Input("counter: uint64")
    .Output("y: T")
    .Output("keep: bool")
    .Attr("threshold: int")
    .Attr("scale: float")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(0));
      return ::absl::OkStatus();
    });
REGISTER_OP("GptDropoutGrad")
    .Input("dy: T")
    .Input("keep: bool")
    .Output("dx: T")
    .Attr("scale: float")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn(SameShapeAsInput0);

constexpr int kPhiloxLanes = 16;  // Philox counters per block: 16 x 4 uint32 = 128 draws
typedef uint64_t U64x8 __attribute__((vector_size(64)));  // 8 lanes, each holding a uint32 word

// The Philox4x32-10 outputs for counters (counter + first .. counter + first + 15) under key, as
// TensorFlow's PhiloxRandom computes them: words[w][j] is word w of counter + first + j. Eight
// counters per vector, each 32-bit word in a 64-bit lane, so the 32 x 32 -> 64-bit products vectorise.
inline void PhiloxBlock(uint64_t counter_lo, uint64_t counter_hi, uint64_t first, uint32_t key0, uint32_t key1,
                        uint32_t words[4][kPhiloxLanes]) {
  for (int half = 0; half < kPhiloxLanes / 8; ++half) {
    U64x8 c0, c1, c2, c3;
    for (int j = 0; j < 8; ++j) {  // the 128-bit counter plus first + 8 half + j
      const uint64_t lo = counter_lo + first + 8 * half + j;
      const uint64_t hi = counter_hi + (lo < counter_lo ? 1 : 0);
      c0[j] = static_cast<uint32_t>(lo);
      c1[j] = lo >> 32;
      c2[j] = static_cast<uint32_t>(hi);
      c3[j] = hi >> 32;
    }
    uint32_t k0 = key0, k1 = key1;
    for (int round = 0; round < 10; ++round) {
      const U64x8 p0 = c0 * 0xD2511F53ull, p1 = c2 * 0xCD9E8D57ull;
      const U64x8 n0 = (p1 >> 32) ^ c1 ^ static_cast<uint64_t>(k0);
      const U64x8 n2 = (p0 >> 32) ^ c3 ^ static_cast<uint64_t>(k1);
      c1 = p1 & 0xFFFFFFFFull;
      c3 = p0 & 0xFFFFFFFFull;
      c0 = n0;
      c2 = n2;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    for (int j = 0; j < 8; ++j) {
      words[0][8 * half + j] = static_cast<uint32_t>(c0[j]);
      words[1][8 * half + j] = static_cast<uint32_t>(c1[j]);
      words[2][8 * half + j] = static_cast<uint32_t>(c2[j]);
      words[3][8 * half + j] = static_cast<uint32_t>(c3[j]);
    }
  }
}

// y = keep ? x * scale : 0 (keep: 0 or 1), branch-free so it vectorises; y may be x's buffer.
template <typename T>
inline void ScaleKept(int64_t n, float scale, const T* x, const uint8_t* __restrict keep, T* y) {
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = Eigen::numext::bit_cast<uint32_t>(ToFloat(x[i]) * scale) & (0u - keep[i]);
    Store(Eigen::numext::bit_cast<float>(bits), y + i);
  }
}

template <typename T>
class DropoutOp : public OpKernel {
 public:
  explicit DropoutOp(OpKernelConstruction* c) : OpKernel(c) {
    int threshold;
    OP_REQUIRES_OK(c, c->GetAttr("threshold", &threshold));
    OP_REQUIRES(c, threshold >= -32768 && threshold <= 32768,
                ::tensorflow::errors::InvalidArgument("GptDropout: threshold ", threshold, " is not in [-32768, 32768]"));
    threshold_ = threshold;
    OP_REQUIRES_OK(c, c->GetAttr("scale", &scale_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& key = ctx->input(1);
    const Tensor& counter = ctx->input(2);
    OP_REQUIRES(ctx, key.NumElements() == 1 && counter.NumElements() == 2,
                ::tensorflow::errors::InvalidArgument("GptDropout: key must hold 1 uint64 and counter 2 (Philox), got ",
                                                      key.shape().DebugString(), " and ", counter.shape().DebugString()));
    Tensor *y = nullptr, *keep = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, x.shape(), &keep));
    const uint64_t k = key.flat<uint64_t>()(0), counter_lo = counter.flat<uint64_t>()(0),
                   counter_hi = counter.flat<uint64_t>()(1);
    const uint32_t key0 = static_cast<uint32_t>(k), key1 = static_cast<uint32_t>(k >> 32);
    const int threshold = threshold_;
    const float scale = ToFloat(T(scale_));  // the graph multiplies by the scale in x's dtype
    const T* px = x.flat<T>().data();
    T* py = y->flat<T>().data();
    bool* pkeep = keep->flat<bool>().data();
    const int64_t n = x.NumElements();
    constexpr int64_t kBlock = 8 * kPhiloxLanes;  // draws per block: 2 per uint32, 4 uint32 per counter
    auto drop = [=](int64_t first_block, int64_t end_block) {
      uint32_t words[4][kPhiloxLanes];
      for (int64_t b = first_block; b < end_block; ++b) {
        PhiloxBlock(counter_lo, counter_hi, static_cast<uint64_t>(b) * kPhiloxLanes, key0, key1, words);
        int16_t draws[kBlock];  // draw 8j + 2w + h: half h of word w of counter j
        for (int j = 0; j < kPhiloxLanes; ++j) {
          for (int w = 0; w < 4; ++w) {
            draws[8 * j + 2 * w] = static_cast<int16_t>(words[w][j] & 0xFFFFu);
            draws[8 * j + 2 * w + 1] = static_cast<int16_t>(words[w][j] >> 16);
          }
        }
        const int64_t begin = b * kBlock, count = std::min(kBlock, n - begin);
        uint8_t* kb = reinterpret_cast<uint8_t*>(pkeep + begin);  // bool: one byte, 0 or 1
        for (int64_t i = 0; i < count; ++i) kb[i] = draws[i] >= threshold ? 1 : 0;
        ScaleKept(count, scale, px + begin, kb, py + begin);
      }
    };
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, blocks, /*cost_per_unit=*/40 * kBlock, drop);
  }

 private:
  int threshold_;
  float scale_;
};

template <typename T>
class DropoutGradOp : public OpKernel {
 public:
  explicit DropoutGradOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, c->GetAttr("scale", &scale_)); }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& dy = ctx->input(0);
    const Tensor& keep = ctx->input(1);
    OP_REQUIRES(ctx, dy.shape() == keep.shape(),
                ::tensorflow::errors::InvalidArgument("GptDropoutGrad: dy ", dy.shape().DebugString(), " and keep ",
                                                      keep.shape().DebugString(), " differ"));
    Tensor* dx = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, dy.shape(), &dx));
    const float scale = ToFloat(T(scale_));
    const T* pdy = dy.flat<T>().data();
    const bool* pkeep = keep.flat<bool>().data();
    T* pdx = dx->flat<T>().data();
    auto grad = [=](int64_t begin, int64_t end) {
      ScaleKept(end - begin, scale, pdy + begin, reinterpret_cast<const uint8_t*>(pkeep + begin), pdx + begin);
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, dy.NumElements(), /*cost_per_unit=*/4, grad);
  }

 private:
  float scale_;
};

#define GPT_TF_REGISTER(T)                                                                                  \
  REGISTER_KERNEL_BUILDER(Name("GptFusedAdamW").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),   \
                          FusedAdamWOp<T>);                                                                 \
  REGISTER_KERNEL_BUILDER(Name("GptGelu").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), GeluOp<T>); \
  REGISTER_KERNEL_BUILDER(Name("GptGeluGrad").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),     \
                          GeluGradOp<T>);                                                           \
  REGISTER_KERNEL_BUILDER(Name("GptLayerNorm").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),    \
                          LayerNormOp<T>);                                                          \
  REGISTER_KERNEL_BUILDER(Name("GptLayerNormGrad").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
                          LayerNormGradOp<T>);                                                      \
  REGISTER_KERNEL_BUILDER(Name("GptDropout").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),      \
                          DropoutOp<T>);                                                            \
  REGISTER_KERNEL_BUILDER(Name("GptDropoutGrad").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),  \
                          DropoutGradOp<T>);
GPT_TF_REGISTER(float)
GPT_TF_REGISTER(bfloat16)
#undef GPT_TF_REGISTER

}  // namespace gpt_tf
