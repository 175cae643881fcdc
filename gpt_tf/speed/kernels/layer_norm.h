// gpt_tf's fused layer norm and its gradient (gpt_tf/speed/kernels/__init__.py: fused_layer_norm).
#pragma once
#include "common.h"

namespace gpt_tf {

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

// Checks that x [..., d] ends in gamma's [d]; sets d and the number of rows.
inline bool CheckRows(OpKernelContext* ctx, const char* op, const Tensor& x, const Tensor& gamma, int64_t* d, int64_t* rows) {
  if (!(x.dims() >= 1 && gamma.dims() == 1 && x.dim_size(x.dims() - 1) == gamma.dim_size(0))) {
    ctx->CtxFailure(::tensorflow::errors::InvalidArgument(op, ": x ", x.shape().DebugString(),
                                                          " does not end in gamma's ", gamma.shape().DebugString()));
    return false;
  }
  *d = gamma.dim_size(0);
  *rows = *d ? x.NumElements() / *d : 0;
  return true;
}

inline ::tensorflow::TensorShape RowShape(const Tensor& x) {
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

GPT_TF_REGISTER_CPU("GptLayerNorm", LayerNormOp)
GPT_TF_REGISTER_CPU("GptLayerNormGrad", LayerNormGradOp)

}  // namespace gpt_tf
