// gpt_tf's few-row product against 8- or 16-bit weights (gpt_tf/speed/kernels/__init__.py: weight_matmul).
//
// Generation runs one token per row through every weight, so its time is the time to read the weights: a
// float32 MatMul reads 4 bytes per weight, this kernel 1 (int8) or 2 (bfloat16), decoded in registers and never
// written back:
//
//   int8 weights, quantize_inputs (Keras's int8 Dense / ReversibleEmbedding with its input quantizer): each row of
//     x quantized as Keras's abs_max_quantize does, s = 127 / (max|x| + 1e-7), q = clip(rint(x s), -127, 127); the
//     integer sum of q w exactly (int32; AVX512-VNNI's vpdpbusd, 64 products an instruction, on the weights as
//     bytes w + 128, the 128 sum q taken off), then Keras's de-scaling y = sum / (scale[n] s): Keras's numbers to
//     the bit.
//   int8 weights, weight-only (Keras's int8 with no input quantizer): y = (sum_k x w) / scale[n], float32 sums.
//   bfloat16 weights: y = sum_k x w (x float32 or bfloat16), float32 sums, y in Tout.
//
// w is [K, N] (a Dense kernel) or, with transpose_w, [N, K] (the tied token table as the LM head). [K, N] is read
// row after row, 8 rows at a time (8 streams the prefetchers follow; a column block over all of K would be a stride
// of N bytes they do not), into sums for the thread's columns in L1; [N, K]'s rows are dot products. Columns (or the
// table's rows) are shared out over TensorFlow's intra-op threads. Without AVX-512 (BW, VL; VNNI for the exact int8
// path) the same arithmetic runs as plain loops.
#pragma once
#include <cstring>
#include <type_traits>

#include "weight_matmul_blocks.h"

namespace gpt_tf {

REGISTER_OP("GptWeightMatmul")
    .Input("x: Tx")
    .Input("w: Tw")
    .Input("scale: float")
    .Output("y: Tout")
    .Attr("Tx: {float, bfloat16}")
    .Attr("Tw: {int8, bfloat16}")
    .Attr("Tout: {float, bfloat16}")
    .Attr("transpose_w: bool = false")
    .Attr("quantize_inputs: bool = false")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      bool transpose = false;
      TF_RETURN_IF_ERROR(c->GetAttr("transpose_w", &transpose));
      ::tensorflow::shape_inference::ShapeHandle x, w;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &w));
      c->set_output(0, c->Matrix(c->Dim(x, 0), c->Dim(w, transpose ? 0 : 1)));
      return ::absl::OkStatus();
    });


template <typename TX, typename TW, typename TOUT>
class WeightMatmulOp : public OpKernel {
 public:
  explicit WeightMatmulOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("transpose_w", &transpose_));
    OP_REQUIRES_OK(c, c->GetAttr("quantize_inputs", &quantize_));
    OP_REQUIRES(c, (!quantize_ || kInt8),
                ::tensorflow::errors::InvalidArgument("GptWeightMatmul: quantize_inputs needs int8 weights"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& w = ctx->input(1);
    const Tensor& scale = ctx->input(2);
    OP_REQUIRES(ctx, x.dims() == 2 && w.dims() == 2,
                ::tensorflow::errors::InvalidArgument("GptWeightMatmul: x and w must be matrices, got ",
                                                      x.shape().DebugString(), " and ", w.shape().DebugString()));
    const int64_t M = x.dim_size(0), K = x.dim_size(1);
    const int64_t N = w.dim_size(transpose_ ? 0 : 1);
    OP_REQUIRES(ctx, w.dim_size(transpose_ ? 1 : 0) == K && K <= wm::kMaxK,
                ::tensorflow::errors::InvalidArgument("GptWeightMatmul: x ", x.shape().DebugString(), " and w ",
                                                      w.shape().DebugString(), " do not multiply (or K > ",
                                                      wm::kMaxK, ")"));
    OP_REQUIRES(ctx, kInt8 ? (scale.dims() == 1 && scale.dim_size(0) == N) : scale.NumElements() == 0,
                ::tensorflow::errors::InvalidArgument("GptWeightMatmul: scale must be [", N,
                                                      "] for int8 weights, empty for bfloat16 ones; got ",
                                                      scale.shape().DebugString()));
    Tensor* y = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {M, N}, &y));
    if (M == 0 || N == 0) return;
    const wm::Rows rows = PrepareRows(x);
    const TW* ws = w.flat<TW>().data();
    const float* sc = kInt8 ? scale.flat<float>().data() : nullptr;
    TOUT* out = y->flat<TOUT>().data();

    // y[m][n] from the sum over k (on the exact path, the integer sum plus 128 sum q), in Keras's de-scaling.
    auto finish = [&](int64_t m, int64_t n, float sum, int32_t exact) {
      float v = sum;
      if (quantize_) {
        v = static_cast<float>(exact - 128 * rows.qsum[m]) / (sc[n] * rows.scale[m]);
      } else if (kInt8) {
        v = sum / sc[n];
      }
      Store(v, out + m * N + n);
    };
    const auto& threads = *ctx->device()->tensorflow_cpu_worker_threads();
    if (transpose_) {
      RunTransposed(rows, ws, N, finish, threads);
    } else {
      RunColumns(rows, ws, N, finish, threads);
    }
  }

 private:
  static constexpr bool kInt8 = std::is_same<TW, int8_t>::value;
  static constexpr bool kBf16 = std::is_same<TW, bfloat16>::value;

  wm::Rows PrepareRows(const Tensor& x) const {
    wm::Rows rows;
    rows.M = x.dim_size(0);
    rows.K = x.dim_size(1);
    rows.K64 = (rows.K + 63) / 64 * 64;
    const int64_t M = rows.M, K = rows.K;
    rows.f.resize(M * K);
    rows.scale.assign(M, 1.0f);
    rows.qsum.assign(M, 0);
    const TX* xs = x.flat<TX>().data();
    for (int64_t i = 0; i < M * K; ++i) rows.f[i] = ToFloat(xs[i]);
    if (!quantize_) return rows;
    rows.q.assign(M * rows.K64, 0);
    for (int64_t m = 0; m < M; ++m) {
      float* row = rows.f.data() + m * K;
      float amax = 0.0f;
      for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(row[k]));
      const float s = 127.0f / (amax + wm::kEpsilon);
      for (int64_t k = 0; k < K; ++k) {
        row[k] = std::min(127.0f, std::max(-127.0f, std::nearbyint(row[k] * s)));
        rows.q[m * rows.K64 + k] = static_cast<int8_t>(row[k]);
        rows.qsum[m] += static_cast<int32_t>(row[k]);
      }
      rows.scale[m] = s;
    }
    return rows;
  }

  // w [K, N]: K in chunks (one where x has many rows: wm::kSplitRows), each chunk's columns in blocks of 64; a
  // thread takes a range of (chunk, block) units and reads each chunk's rows (its share of them) row after row, at
  // most kMaxBlocks blocks at a time, its sums in an L1 buffer, then into the chunk's partial sums; the chunks'
  // sums added in their order.
  template <typename Finish>
  void RunColumns(const wm::Rows& rows, const TW* w, int64_t N, Finish finish,
                  const ::tensorflow::DeviceBase::CpuWorkerThreads& threads) const {
    const int64_t M = rows.M, K = rows.K;
    const int64_t blocks = (N + wm::kBlock - 1) / wm::kBlock;
    const int64_t wanted = M <= wm::kSplitRows ? std::min(wm::kChunks, std::max<int64_t>(1, K / wm::kMinChunk)) : 1;
    const int64_t span = ((K + wanted - 1) / wanted + wm::kRows - 1) / wm::kRows * wm::kRows;  // whole row groups
    const int64_t chunks = (K + span - 1) / span;
    std::vector<float> fpart(quantize_ ? 0 : chunks * M * N);
    std::vector<int32_t> ipart(quantize_ ? chunks * M * N : 0);
    constexpr int64_t kMaxBlocks = 64;  // 4096 columns: a row of w read whole (a thread's share of it)
    auto work = [&](int64_t begin, int64_t end) {
      std::vector<float> fsums;
      std::vector<int32_t> isums;
      for (int64_t u = begin; u < end;) {
        const int64_t c = u / blocks, k0 = c * span, k1 = std::min(K, k0 + span);
        const int64_t b = u % blocks, n0 = b * wm::kBlock;
        const int64_t width = std::min({end - u, blocks - b, kMaxBlocks}) * wm::kBlock;
        const int64_t cols = std::min(N - n0, width);
        if (quantize_) {
          isums.assign(M * width, 0);
          ExactColumns(rows, k0, k1, w, N, n0, cols, isums.data(), width);
        } else {
          fsums.assign(M * width, 0.0f);
          FloatColumns(rows, k0, k1, w, N, n0, cols, fsums.data(), width);
        }
        for (int64_t m = 0; m < M; ++m)
          for (int64_t i = 0; i < width; ++i) {
            const int64_t j = quantize_ ? ExactColumnOf(i) : FloatColumnOf(i);
            if (j >= cols) continue;
            const int64_t at = (c * M + m) * N + n0 + j;
            if (quantize_) {
              ipart[at] = isums[m * width + i];
            } else {
              fpart[at] = fsums[m * width + i];
            }
          }
        u += width / wm::kBlock;
      }
    };
    ::tensorflow::Shard(threads.num_threads, threads.workers, chunks * blocks, wm::kBlock * span * (M + 2), work);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        float fsum = 0.0f;
        int32_t isum = 0;
        for (int64_t c = 0; c < chunks; ++c) {
          if (quantize_) {
            isum += ipart[(c * M + m) * N + n];
          } else {
            fsum += fpart[(c * M + m) * N + n];
          }
        }
        finish(m, n, fsum, isum);
      }
  }

  // w [N, K]: each output a row of w against each row of x; rows of w in units of 16 over the threads.
  template <typename Finish>
  void RunTransposed(const wm::Rows& rows, const TW* w, int64_t N, Finish finish,
                     const ::tensorflow::DeviceBase::CpuWorkerThreads& threads) const {
    const int64_t M = rows.M, K = rows.K;
    std::vector<float> permuted;
    const float* xf = rows.f.data();
    int64_t stride = K;
#ifdef GPT_TF_WM_AVX512
    if (kBf16 && !quantize_) {  // x in the order Decode64 lays a bfloat16 row out
      stride = rows.K64;
      permuted.resize(M * stride);
      for (int64_t m = 0; m < M; ++m) wm::PermuteX(rows.f.data() + m * K, K, permuted.data() + m * stride);
      xf = permuted.data();
    }
#endif
    constexpr int64_t kUnit = 16;
    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t n = begin * kUnit; n < std::min(N, end * kUnit); ++n) {
        const TW* wn = w + n * K;
        if (n + 4 < N)  // the row 4 ahead, a line in every 64 bytes
          for (int64_t b = 0; b < K * static_cast<int64_t>(sizeof(TW)); b += 64)
            wm::Prefetch(reinterpret_cast<const char*>(w + (n + 4) * K) + b);
        for (int64_t m = 0; m < M; ++m) {
          if (quantize_) {
            finish(m, n, 0.0f, ExactDotOf(rows, m, wn));
          } else {
            finish(m, n, wm::FloatDot(xf + m * stride, wn, K), 0);
          }
        }
      }
    };
    ::tensorflow::Shard(threads.num_threads, threads.workers, (N + kUnit - 1) / kUnit, kUnit * K * (M + 2), work);
  }

  static int64_t FloatColumnOf(int64_t i) {
#ifdef GPT_TF_WM_AVX512
    return wm::FloatColumn(kBf16, i);
#else
    return i;
#endif
  }
  static int64_t ExactColumnOf(int64_t i) {
#ifdef GPT_TF_WM_VNNI
    return wm::ExactColumn(i);
#else
    return i;
#endif
  }

  // sums[m][...] over k in [k0, k1) (FloatColumn's order).
  void FloatColumns(const wm::Rows& rows, int64_t k0, int64_t k1, const TW* w, int64_t N, int64_t n0, int64_t cols,
                    float* sums, int64_t width) const {
    const int64_t M = rows.M, K = rows.K;
#ifdef GPT_TF_WM_AVX512
    wm::FloatRows(rows.f.data() + k0, K, M, k1 - k0, w + k0 * N, N, n0, cols, sums, width);
#else
    for (int64_t k = k0; k < k1; ++k)
      for (int64_t m = 0; m < M; ++m) {
        const float xk = rows.f[m * K + k];
        for (int64_t j = 0; j < cols; ++j) sums[m * width + j] += xk * wm::Decode(w[k * N + n0 + j]);
      }
#endif
  }

  // The exact sums of q and w over k in [k0, k1), plus 128 sum q there (finish takes the whole sum's off); k0 a
  // multiple of kRows, k1 too or K (q is 0 past K).
  void ExactColumns(const wm::Rows& rows, int64_t k0, int64_t k1, const TW* w, int64_t N, int64_t n0, int64_t cols,
                    int32_t* sums, int64_t width) const {
    const int64_t M = rows.M;
#ifdef GPT_TF_WM_VNNI
    wm::ExactRows(rows.q.data() + k0, M, rows.K64, k1 - k0, reinterpret_cast<const int8_t*>(w + k0 * N), N, n0, cols,
                  sums, width);
#else
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = k0; k < k1; ++k) {
        const int32_t qk = rows.q[m * rows.K64 + k];
        for (int64_t j = 0; j < cols; ++j)
          sums[m * width + j] += qk * (static_cast<int32_t>(wm::Decode(w[k * N + n0 + j])) + 128);
      }
#endif
  }

  static int32_t ExactDotOf(const wm::Rows& rows, int64_t m, const TW* wn) {
    const int64_t K = rows.K;
    const int8_t* q = rows.q.data() + m * rows.K64;
#ifdef GPT_TF_WM_VNNI
    return wm::ExactDot(q, reinterpret_cast<const int8_t*>(wn), K);
#else
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += static_cast<int32_t>(q[k]) * (static_cast<int32_t>(wm::Decode(wn[k])) + 128);
    return sum;
#endif
  }

  bool transpose_ = false;
  bool quantize_ = false;
};

#define GPT_TF_REGISTER_WEIGHT_MATMUL(TX, TW, TOUT)                                                          \
  REGISTER_KERNEL_BUILDER(Name("GptWeightMatmul")                                                          \
                              .Device(::tensorflow::DEVICE_CPU)                                            \
                              .TypeConstraint<TX>("Tx")                                                    \
                              .TypeConstraint<TW>("Tw")                                                    \
                              .TypeConstraint<TOUT>("Tout"),                                               \
                          WeightMatmulOp<TX, TW, TOUT>);
#define GPT_TF_REGISTER_WEIGHT_MATMUL_OUT(TX, TW) \
  GPT_TF_REGISTER_WEIGHT_MATMUL(TX, TW, float)    \
  GPT_TF_REGISTER_WEIGHT_MATMUL(TX, TW, bfloat16)
GPT_TF_REGISTER_WEIGHT_MATMUL_OUT(float, int8_t)
GPT_TF_REGISTER_WEIGHT_MATMUL_OUT(bfloat16, int8_t)
GPT_TF_REGISTER_WEIGHT_MATMUL_OUT(float, bfloat16)
GPT_TF_REGISTER_WEIGHT_MATMUL_OUT(bfloat16, bfloat16)
#undef GPT_TF_REGISTER_WEIGHT_MATMUL_OUT
#undef GPT_TF_REGISTER_WEIGHT_MATMUL

}  // namespace gpt_tf
