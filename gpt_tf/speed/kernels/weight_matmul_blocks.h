// gpt_tf's few-row weight products: the vector loops of weight_matmul.h (its header says what they compute).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define GPT_TF_WM_AVX512 1
#if defined(__AVX512VNNI__)
#define GPT_TF_WM_VNNI 1
#endif
#endif


namespace gpt_tf {

namespace wm {

constexpr float kEpsilon = 1e-7f;  // keras.config.epsilon(), abs_max_quantize's
constexpr int64_t kBlock = 64;     // columns a thread's share is counted in
constexpr int64_t kRows = 8;       // rows of w [K, N] read at a time
constexpr int64_t kMaxK = 65536;   // the exact int8 sums stay below 2^31 (K 255 127)
constexpr int64_t kAhead = 2;      // groups of kRows rows of w [K, N] prefetched ahead of the one read
// A few rows (at most kSplitRows) against w [K, N] are summed in chunks of K, at least kMinChunk long, at most
// kChunks of them (a number set by K alone, so that the sums' order is the same on any number of threads): each
// thread then reads whole rows of its chunk, one stream of memory, where a share of columns reads part of every row.
constexpr int64_t kSplitRows = 4, kChunks = 4, kMinChunk = 256;

// Asks for the cache line at p ahead of its use (one thread's loads alone keep too few lines in flight to read
// memory at its rate; measured: ~7 GB/s without, one Xeon core).
inline void Prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

inline float Decode(int8_t w) { return static_cast<float>(w); }
inline float Decode(bfloat16 w) { return ToFloat(w); }

// The rows of x, as float32 (quantized to whole numbers on the exact path: q, also as bytes, with their sums).
struct Rows {
  int64_t M = 0, K = 0, K64 = 0;  // K64: K rounded up to 64, the byte rows' length
  std::vector<float> f;            // [M, K]
  std::vector<int8_t> q;           // [M, K64]: q (exact path only; 0 past K)
  std::vector<int32_t> qsum;       // [M]: sum_k q
  std::vector<float> scale;        // [M]: Keras's input scale s (exact path), else 1
};

// Where the sum of column j of a block of 32 (bfloat16) sits: a bfloat16 vector decodes as the (low, high) halves
// of each 128-bit lane (FloatColumn maps a position to its column); int8 and the exact path keep the columns' order.
inline int64_t FloatColumn(bool bf16, int64_t i) {
  if (!bf16) return i;
  const int64_t block = i / 32 * 32, h = (i % 32) / 16, lane = (i % 16) / 4, p = i % 4;
  return block + lane * 8 + h * 4 + p;
}
// The exact path interleaves 4 rows of 64 columns into 4 vectors of dwords (4 rows of one column each).
inline int64_t ExactColumn(int64_t i) {
  const int64_t block = i / 64 * 64, j = (i % 64) / 16, lane = (i % 16) / 4, p = i % 4;
  return block + lane * 16 + j * 4 + p;
}

#ifdef GPT_TF_WM_AVX512
inline __mmask16 Mask16(int64_t count) {
  return count >= 16 ? __mmask16(0xffff) : __mmask16((1u << std::max<int64_t>(count, 0)) - 1);
}
inline __mmask32 Mask32(int64_t count) {
  return count >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << std::max<int64_t>(count, 0)) - 1);
}
inline __mmask64 Mask64(int64_t count) {
  return count >= 64 ? __mmask64(~0ull) : __mmask64((1ull << std::max<int64_t>(count, 0)) - 1);
}

// One row's next columns as float32 vectors: int8 16 columns (1 vector), bfloat16 32 (2, FloatColumn's order).
template <typename TW>
struct Step;
template <>
struct Step<int8_t> {
  static constexpr int kVectors = 1, kCols = 16;
  static void Decode(const int8_t* p, int64_t cols, __m512* v) {
    v[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(Mask16(cols), p)));
  }
};
template <>
struct Step<bfloat16> {
  static constexpr int kVectors = 2, kCols = 32;
  static void Decode(const bfloat16* p, int64_t cols, __m512* v) {
    const __m512i bits = _mm512_maskz_loadu_epi16(Mask32(cols), p), zero = _mm512_setzero_si512();
    v[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, bits));
    v[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, bits));
  }
};

// sums[m][c] += over k in [0, K) of x[m][k] w[k][n0 + c] (c in FloatColumn's order), c < cols, for the M rows of x.
// x's rows are ldx apart (x and w may start at a row k0 of a longer product: a K chunk).
template <typename TW>
void FloatRows(const float* x, int64_t ldx, int64_t M, int64_t K, const TW* w, int64_t N, int64_t n0, int64_t cols,
               float* sums, int64_t width) {
  using S = Step<TW>;
  for (int64_t k = 0; k < K; k += kRows) {
    const int64_t live = std::min(kRows, K - k);
    const bool ahead = k + (kAhead + 1) * kRows <= K;
    for (int64_t j = 0; j < cols; j += S::kCols) {
      if (ahead)
        for (int i = 0; i < kRows; ++i) Prefetch(w + (k + kAhead * kRows + i) * N + n0 + j);
      __m512 v[kRows][S::kVectors];
      for (int i = 0; i < kRows; ++i) {
        if (i < live) {
          S::Decode(w + (k + i) * N + n0 + j, cols - j, v[i]);
        } else {
          for (int q = 0; q < S::kVectors; ++q) v[i][q] = _mm512_setzero_ps();
        }
      }
      for (int64_t m = 0; m < M; ++m) {
        const float* xm = x + m * ldx + k;
        float* out = sums + m * width + j;
        for (int q = 0; q < S::kVectors; ++q) {
          __m512 a = _mm512_loadu_ps(out + 16 * q), b = _mm512_setzero_ps();
          for (int i = 0; i < kRows; i += 2) {  // two chains
            a = _mm512_fmadd_ps(v[i][q], _mm512_set1_ps(i < live ? xm[i] : 0.0f), a);
            b = _mm512_fmadd_ps(v[i + 1][q], _mm512_set1_ps(i + 1 < live ? xm[i + 1] : 0.0f), b);
          }
          _mm512_storeu_ps(out + 16 * q, _mm512_add_ps(a, b));
        }
      }
    }
  }
}

// A [N, K] table row's 64 elements as 4 float32 vectors (bfloat16: in FloatColumn's order, which PermuteX gives x).
inline void Decode64(const int8_t* p, int64_t count, __m512 v[4]) {
  for (int q = 0; q < 4; ++q) Step<int8_t>::Decode(p + 16 * q, count - 16 * q, v + q);
}
inline void Decode64(const bfloat16* p, int64_t count, __m512 v[4]) {
  for (int h = 0; h < 2; ++h) Step<bfloat16>::Decode(p + 32 * h, count - 32 * h, v + 2 * h);
}
#endif

#ifdef GPT_TF_WM_VNNI
// The exact int8 sums, plus 128 sum_k q (ExactColumn's order), of the M rows of q and w [K, N]'s columns from n0,
// added into sums[m][...]: each 4 rows of 64 columns interleaved into 4 vectors of dwords (4 rows of one column),
// flipped to bytes w + 128 (vpdpbusd multiplies unsigned by signed bytes), against each row's 4 q at a time.
inline void ExactRows(const int8_t* q, int64_t M, int64_t K64, int64_t K, const int8_t* w, int64_t N, int64_t n0,
                      int64_t cols, int32_t* sums, int64_t width) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t k = 0; k < K; k += kRows) {
    const bool ahead = k + (kAhead + 1) * kRows <= K;
    for (int64_t j = 0; j < cols; j += 64) {
      if (ahead)
        for (int i = 0; i < kRows; ++i) Prefetch(w + (k + kAhead * kRows + i) * N + n0 + j);
      const __mmask64 mask = Mask64(cols - j);
      __m512i u[2][4];
      for (int h = 0; h < 2; ++h) {
        __m512i rows[4];
        for (int i = 0; i < 4; ++i) {
          const int64_t row = k + 4 * h + i;
          rows[i] = row < K ? _mm512_maskz_loadu_epi8(mask, w + row * N + n0 + j) : _mm512_setzero_si512();
        }
        const __m512i t0 = _mm512_unpacklo_epi8(rows[0], rows[1]), t1 = _mm512_unpackhi_epi8(rows[0], rows[1]);
        const __m512i t2 = _mm512_unpacklo_epi8(rows[2], rows[3]), t3 = _mm512_unpackhi_epi8(rows[2], rows[3]);
        u[h][0] = _mm512_xor_si512(_mm512_unpacklo_epi16(t0, t2), flip);
        u[h][1] = _mm512_xor_si512(_mm512_unpackhi_epi16(t0, t2), flip);
        u[h][2] = _mm512_xor_si512(_mm512_unpacklo_epi16(t1, t3), flip);
        u[h][3] = _mm512_xor_si512(_mm512_unpackhi_epi16(t1, t3), flip);
      }
      for (int64_t m = 0; m < M; ++m) {
        int32_t quads[2];
        std::memcpy(quads, q + m * K64 + k, 8);  // q is 0 past K (whose weights are 0, flipped to 128)
        const __m512i x0 = _mm512_set1_epi32(quads[0]), x1 = _mm512_set1_epi32(quads[1]);
        int32_t* out = sums + m * width + j;
        for (int v = 0; v < 4; ++v) {
          const __m512i a = _mm512_dpbusd_epi32(_mm512_loadu_si512(out + 16 * v), u[0][v], x0);
          _mm512_storeu_si512(out + 16 * v, _mm512_dpbusd_epi32(a, u[1][v], x1));
        }
      }
    }
  }
}

// The exact int8 sum, plus 128 sum_k q, of q and the row wn of a [N, K] table (q 0 from K to K64).
inline int32_t ExactDot(const int8_t* q, const int8_t* wn, int64_t K) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
  int64_t k = 0;
  for (; k + 128 <= K; k += 128) {
    acc0 = _mm512_dpbusd_epi32(acc0, _mm512_xor_si512(_mm512_loadu_si512(wn + k), flip), _mm512_loadu_si512(q + k));
    acc1 = _mm512_dpbusd_epi32(acc1, _mm512_xor_si512(_mm512_loadu_si512(wn + k + 64), flip),
                               _mm512_loadu_si512(q + k + 64));
  }
  for (; k < K; k += 64) {
    const __m512i b = _mm512_xor_si512(_mm512_maskz_loadu_epi8(Mask64(K - k), wn + k), flip);
    acc0 = _mm512_dpbusd_epi32(acc0, b, _mm512_loadu_si512(q + k));
  }
  return _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1));
}
#endif

// The float32 dot product of x and the row wn of a [N, K] table (bfloat16: x in Decode64's order, PermuteX).
template <typename TW>
inline float FloatDot(const float* x, const TW* wn, int64_t K) {
#ifdef GPT_TF_WM_AVX512
  __m512 s[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t k = 0; k < K; k += 64) {
    __m512 v[4];
    Decode64(wn + k, K - k, v);
    for (int q = 0; q < 4; ++q) {  // a bfloat16 row's x is permuted and padded to whole blocks (PermuteX)
      const float* xk = x + k + 16 * q;
      const __m512 xq = std::is_same<TW, bfloat16>::value ? _mm512_loadu_ps(xk)
                                                          : _mm512_maskz_loadu_ps(Mask16(K - k - 16 * q), xk);
      s[q] = _mm512_fmadd_ps(v[q], xq, s[q]);
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3])));
#else
  float lanes[16] = {};
  int64_t k = 0;
  for (; k + 16 <= K; k += 16)
    for (int j = 0; j < 16; ++j) lanes[j] += x[k + j] * Decode(wn[k + j]);
  float sum = 0.0f;
  for (; k < K; ++k) sum += x[k] * Decode(wn[k]);
  for (int j = 0; j < 16; ++j) sum += lanes[j];
  return sum;
#endif
}

// x's row in the order Decode64 lays out a bfloat16 table row (FloatColumn's), padded with 0 to whole 64s.
inline void PermuteX(const float* x, int64_t K, float* out) {
  for (int64_t k0 = 0; k0 < K; k0 += 64)
    for (int64_t i = 0; i < 64; ++i) {
      const int64_t k = k0 + FloatColumn(true, i);
      out[k0 + i] = k < K ? x[k] : 0.0f;
    }
}

}  // namespace wm

}  // namespace gpt_tf
