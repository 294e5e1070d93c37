// Shared by landmark_attention/cpu.cpp (forward kernels), landmark_attention/cpu_backward.cpp (their backward),
// selection/cpu.cpp and pinv/cpu.cpp:
// simd.h's float vectors under short names, a vector exponential, butterfly reductions, the sign and score terms
// and the row products of the few side's transposed vectors.
#pragma once

#include <cmath>
#include <type_traits>
#include <utility>

#include "simd.h"

#if defined(__AVX512F__)
#include <immintrin.h>  // VFIXUPIMMPS (add_times_sign), VSCALEFPS (vexp)
#endif

namespace landmarks {

using simd::kBytes;
using simd::load;
using simd::parallel;
using simd::prefetch_rows;
using simd::store;
constexpr int W = simd::W<float>;                    // floats per vector
constexpr int kAccumulators = kBytes == 64 ? 16 : 8;  // logit vectors held per task (32 or 16 registers)
constexpr int kMaxKeys = 128;

typedef simd::vec<float> vec;
typedef simd::bits<float> ivec;

inline vec splat(float x) { return simd::splat(x); }

// exp(x) for x <= 0 (arguments are s_j - max): Cephes' expf polynomial after x = n ln2 + r, |r| <= ln2 / 2;
// below -87.3 (e^-87.3 ~ 1.2e-38, and -inf from masked keys) the result is exactly 0. AVX-512 scales p by 2^n
// with one VSCALEFPS under a compare's mask (zero below -87.3), four vector operations fewer than building 2^n
// from n's bits, multiplying and masking.
inline vec vexp(vec x) {
  const vec lo = splat(-87.3f), clamped = x < lo ? lo : x;
  const vec shifter = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to the nearest integer
  vec n = (clamped * 1.44269504088896341f + shifter) - shifter;
  vec r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  vec p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
#if defined(__AVX512F__) && LRA_VECTOR_BYTES == 64
  return (vec)_mm512_maskz_scalef_ps(_mm512_cmp_ps_mask((__m512)x, (__m512)lo, _CMP_GE_OQ), (__m512)p, (__m512)n);
#else
  ivec exponent = (__builtin_convertvector(n, ivec) + 127) << 23;
  return (vec)((ivec)(p * (vec)exponent) & (x >= lo));
#endif
}

// All lanes of the result hold the maximum (sum) of v's lanes: log2(W) butterfly steps, each a permutation
// with compile-time lane indices (one shuffle instruction).
template <int Step, size_t... Lane> inline vec swap_lanes(vec v, std::index_sequence<Lane...>) {
  return __builtin_shufflevector(v, v, (Lane ^ Step)...);
}
template <int Step = W / 2, typename F> inline vec butterfly(vec v, F combine) {
  v = combine(v, swap_lanes<Step>(v, std::make_index_sequence<W>{}));
  if constexpr (Step > 1) return butterfly<Step / 2>(v, combine);
  return v;
}
inline vec vmax(vec a, vec b) { return a > b ? a : b; }
inline vec hmax(vec v) { return butterfly(v, vmax); }
inline vec hsum(vec v) { return butterfly(v, [](vec a, vec b) { return a + b; }); }

constexpr int32_t kSignBit = INT32_MIN;
inline vec vabs(vec v) { return simd::vabs<float>(v); }

// a += g * sign(x) and b += g * sign(x), with sign(0) = 0 (torch.sign). AVX-512: sign(x) by one VFIXUPIMMPS
// (per class of x a constant: zero -> +0, negative or -inf -> -1, positive or +inf -> +1, NaN -> NaN) and two
// FMAs; elsewhere g with its sign bit flipped where x < 0, zeroed where x == 0, added twice.
inline void add_times_sign(vec g, vec x, vec& a, vec& b) {
#if defined(__AVX512F__) && LRA_VECTOR_BYTES == 64
  constexpr int kSignTable = static_cast<int>(0xA9A9A821u);  // responses 1, 2, 8, 10, 9, 10, 9, 10 (SDM VFIXUPIMMPS)
  const vec sign = (vec)_mm512_fixupimm_ps((__m512)vec{}, (__m512)x, _mm512_set1_epi32(kSignTable), 0);
  a += g * sign;
  b += g * sign;
#else
  const vec term = (vec)((((ivec)x & kSignBit) ^ (ivec)g) & (ivec)(x != vec{}));
  a += term;
  b += term;
#endif
}

// The score's pairwise term: the dot product's x * f, or for L1 distance (EcoTransformer) max(x, f), two vector
// operations per element where |x - f| takes three: |x - f| = 2 max(x, f) - x - f, so that
//   sum_e |x_e - f_e| = 2 sum_e max(x_e, f_e) - sum_e x_e - sum_e f_e
// (row_products applies the sums). Rounding: the error is eps * (sum |x| + sum |f|) instead of eps * sum |x - f|,
// the same size where x and f are centred (the largest part of a score is then the distance itself).
template <bool L1> inline vec term(vec x, vec f) {
  if constexpr (L1) return vmax(x, f);
  return x * f;
}

// sum_e x[e] of one row (d a multiple of W).
inline float row_sum(const float* x, int64_t d) {
  vec sum = {};
  for (int64_t e = 0; e < d; e += W) sum += load(x + e);
  return hsum(sum)[0];
}

// sums[l] = sum_e ft[e * lanes + l]: the few side's coordinate sums (lanes a multiple of W) for L1 row_products.
inline void lane_sums(const float* ft, int64_t d, int64_t lanes, float* sums) {
  for (int64_t l = 0; l < lanes; l += W) {
    vec sum = {};
    for (int64_t e = 0; e < d; ++e) sum += load(ft + e * lanes + l);
    store(sums + l, sum);
  }
}

// acc[r][u] = sum_e term(x[r * x_row + e], ft[e * MV * W + u * W ..]) for R rows of x against the MV * W columns
// of ft (d x MV * W, the few side transposed): R x MV vectors in registers, each ft vector loaded once for all rows.
// L1: the distances sum_e |x_e - f_e|, from the sums of max and ft_sum (lane_sums of ft; unread for dot products).
template <int R, int MV, bool L1 = false>
inline void row_products(const float* x, int64_t x_row, const float* ft, int64_t d, vec (&acc)[R][MV],
                         const float* ft_sum = nullptr) {
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < MV; ++u) acc[r][u] = vec{};
  for (int64_t e = 0; e < d; ++e) {
    vec f[MV];
    for (int u = 0; u < MV; ++u) f[u] = load(ft + e * MV * W + u * W);
    for (int r = 0; r < R; ++r) {
      const vec xe = splat(x[r * x_row + e]);
      for (int u = 0; u < MV; ++u) acc[r][u] += term<L1>(xe, f[u]);
    }
  }
  if constexpr (L1)
    for (int r = 0; r < R; ++r) {
      const float x_sum = row_sum(x + r * x_row, d);
      for (int u = 0; u < MV; ++u) acc[r][u] = 2.0f * acc[r][u] - (x_sum + load(ft_sum + u * W));
    }
}

// Calls f(std::true_type{}) when l1 is nonzero (L1 distance scores), else f(std::false_type{}) (dot products).
template <typename F> void with_score(int l1, F f) {
  if (l1) return f(std::true_type{});
  f(std::false_type{});
}

// The few side padded to `vectors` = 1, 2, 4, ... vectors (at most kMaxKeys floats): calls f(V{}) with V =
// std::integral_constant<int, vectors> and returns true, or returns false for any other count.
template <int V = 1, typename F> bool with_vectors(int64_t vectors, F f) {
  if constexpr (V * W > kMaxKeys) {
    return false;
  } else {
    if (vectors == V) return f(std::integral_constant<int, V>{}), true;
    return with_vectors<2 * V>(vectors, f);
  }
}

}  // namespace landmarks
