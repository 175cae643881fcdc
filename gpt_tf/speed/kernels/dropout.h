// gpt_tf's fused dropout and its gradient (gpt_tf/speed/kernels/__init__.py: fused_dropout).
#pragma once
#include "common.h"

namespace gpt_tf {

// Dropout as gpt_tf.nn.layers.Dropout16 computes it, mask and all, in one pass (the graph: TF's
// StatelessRandomUniformFullIntV2, a bitcast, a slice, a compare, a product and a select):
//   draws = the int16 halves (low half first) of the uint32 Philox4x32-10 stream of TF's stateless
//           ops for (key, counter) from StatelessRandomGetKeyCounter; element e takes draw e
//   keep  = draw >= threshold;  y = keep ? x * scale : 0  (scale rounded to x's dtype first, as the graph)
// and its gradient dx = keep ? dy * scale : 0. The Philox rounds run eight counters per vector (TF: one);
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

GPT_TF_REGISTER_CPU("GptDropout", DropoutOp)
GPT_TF_REGISTER_CPU("GptDropoutGrad", DropoutGradOp)

}  // namespace gpt_tf
