// CPU kernels of exact L1-distance attention (EcoTransformer, Gao & Xu 2025, eq. 1).
// Built and bound by kernels/l1/cpu.py (plain C ABI through ctypes), which also holds the autograd nodes.
// Tensors are flattened over (batch, heads) to P problems; rows are contiguous, q and dq may be row ranges
// of a longer sequence (qs = elements between problems), everything else is contiguous:
//   distance:  out[p, i, j] = scale * sum_e |q[p, i, e] - kt[p, e, j]|     q (P, a, d), kt (P, d, b), out (P, a, b)
//   sign_grad: dq[p, i, :]  = scale * sum_j g[p, i, j] sign(q_i - k_j)     g (P, a, b), k (P, b, d); dq overwritten
//              dk[p, j, :] -= scale * sum_i g[p, i, j] sign(q_i - k_j)     dk (P, b, d) accumulated; d % W == 0
// Vectors, loads and threads: simd.h.
#include <cmath>

#include "simd.h"

namespace {

using namespace simd;

// Register tiles, sized so that the vectors live across the inner loops fit the register file: 32 registers
// with AVX-512, 16 otherwise (AVX2, SSE2; NEON's 32 are not used).
//   distance_rows:  kDistanceRows x kDistanceVectors accumulators + kDistanceVectors key vectors, a broadcast
//                   query and the abs mask (AVX-512: 16 + 4, AVX2/SSE2: 8 + 4).
//   sign_grad_rows: column groups of NV <= kSignGroup vectors, R = kSignTile / NV rows: R x NV accumulators
//                   + NV key vectors + NV dk sums + a broadcast g, two temporaries and two constants; with 32
//                   registers the R x NV query vectors are held as well (AVX-512: 8 + 8 + <= 9 + 4), with 16
//                   they are reloaded from L1 at each use (AVX2: 8 + <= 5 + 4, GCC folds the key loads
//                   into the subtractions where registers run short; SSE2's two-operand instructions need a
//                   copy more, so 6 accumulators there).
constexpr bool kWide = kBytes == 64;
constexpr int kDistanceRows = kWide ? 8 : 4, kDistanceVectors = 2;
constexpr int kSignGroup = kWide ? 4 : 2, kSignTile = kBytes == 16 ? 6 : 8;
constexpr bool kHoldQueries = kWide;

// g * sign(x) with sign(0) = 0 (torch.sign): flip g's sign bit where x < 0, zero it where x == 0.
template <typename T> inline vec<T> times_sign(vec<T> g, vec<T> x) {
  bits<T> flipped = (bits<T>)g ^ ((bits<T>)x & Lanes<T>::sign);
  return (vec<T>)(flipped & (bits<T>)(x != vec<T>{}));
}

// R query rows against all b keys: R x (JV vectors of keys) accumulators stay in registers, each key
// vector loaded once per R queries.
template <typename T, int R>
void distance_rows(const T* q, const T* kt, T* out, int64_t b, int64_t d, T scale) {
  constexpr int JV = kDistanceVectors, J = JV * W<T>;
  int64_t j = 0;
  for (; j + J <= b; j += J) {
    vec<T> acc[R][JV] = {};
    for (int64_t e = 0; e < d; ++e) {
      vec<T> kv[JV];
      for (int u = 0; u < JV; ++u) kv[u] = load(kt + e * b + j + u * W<T>);
      for (int r = 0; r < R; ++r) {
        vec<T> qv = splat(q[r * d + e]);
        for (int u = 0; u < JV; ++u) acc[r][u] += vabs<T>(qv - kv[u]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < JV; ++u) store(out + r * b + j + u * W<T>, acc[r][u] * scale);
  }
  for (; j < b; ++j)
    for (int r = 0; r < R; ++r) {
      T sum = 0;
      for (int64_t e = 0; e < d; ++e) sum += std::abs(q[r * d + e] - kt[e * b + j]);
      out[r * b + j] = scale * sum;
    }
}

template <typename T>
void distance(const T* q, int64_t qs, const T* kt, T* out, int64_t P, int64_t a, int64_t b, int64_t d, T scale,
              int threads) {
  constexpr int R = kDistanceRows;
  const int64_t blocks = (a + R - 1) / R;
  parallel(P * blocks, threads, [=](int64_t lo, int64_t hi) {
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t p = task / blocks, i = task % blocks * R;
      const T* qp = q + p * qs + i * d;
      const T* kp = kt + p * d * b;
      T* op = out + (p * a + i) * b;
      if (i + R <= a) {
        distance_rows<T, R>(qp, kp, op, b, d, scale);
      } else {
        for (int64_t row = i; row < a; ++row, qp += d, op += b) distance_rows<T, 1>(qp, kp, op, b, d, scale);
      }
    }
  });
}

// R query rows, NV vectors of columns (starting at the given pointers, row stride d), against all b keys.
// The query vectors are held in registers when kHoldQueries, else loaded at each use.
template <typename T, int R, int NV>
void sign_grad_rows(const T* g, const T* q, const T* k, T* dq, T* dk, int64_t b, int64_t d, T scale) {
  vec<T> qv[R][NV], acc[R][NV] = {};
  if constexpr (kHoldQueries)
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < NV; ++u) qv[r][u] = load(q + r * d + u * W<T>);
  for (int64_t j = 0; j < b; ++j) {
    vec<T> kv[NV], dkv[NV] = {};
    for (int u = 0; u < NV; ++u) kv[u] = load(k + j * d + u * W<T>);
    for (int r = 0; r < R; ++r) {
      vec<T> gr = splat(g[r * b + j]);
      for (int u = 0; u < NV; ++u) {
        vec<T> s = times_sign<T>(gr, (kHoldQueries ? qv[r][u] : load(q + r * d + u * W<T>)) - kv[u]);
        acc[r][u] += s;
        dkv[u] += s;
      }
    }
    for (int u = 0; u < NV; ++u) store(dk + j * d + u * W<T>, load(dk + j * d + u * W<T>) - dkv[u] * scale);
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) store(dq + r * d + u * W<T>, acc[r][u] * scale);
}

template <typename T, int NV>
void sign_grad_columns(const T* g, const T* q, const T* k, T* dq, T* dk, int64_t a, int64_t b, int64_t d, T scale) {
  constexpr int R = kSignTile / NV;
  int64_t i = 0;
  for (; i + R <= a; i += R) sign_grad_rows<T, R, NV>(g + i * b, q + i * d, k, dq + i * d, dk, b, d, scale);
  for (; i < a; ++i) sign_grad_rows<T, 1, NV>(g + i * b, q + i * d, k, dq + i * d, dk, b, d, scale);
}

template <typename T>
void sign_grad(const T* g, const T* q, int64_t qs, const T* k, T* dq, T* dk, int64_t P, int64_t a, int64_t b,
               int64_t d, T scale, int threads) {
  parallel(P, threads, [=](int64_t lo, int64_t hi) {  // one problem per task: dk rows are summed over queries
    for (int64_t p = lo; p < hi; ++p)
      for (int64_t e = 0; e < d; e += kSignGroup * W<T>) {  // groups of vectors of columns (signs are per column)
        const T *gp = g + p * a * b, *qp = q + p * qs + e, *kp = k + p * b * d + e;
        T *dqp = dq + p * qs + e, *dkp = dk + p * b * d + e;
        switch (std::min<int64_t>(kSignGroup, (d - e) / W<T>)) {  // cases above kSignGroup never occur
          case 1: sign_grad_columns<T, 1>(gp, qp, kp, dqp, dkp, a, b, d, scale); break;
          case 2: sign_grad_columns<T, 2>(gp, qp, kp, dqp, dkp, a, b, d, scale); break;
          case 3: sign_grad_columns<T, std::min(3, kSignGroup)>(gp, qp, kp, dqp, dkp, a, b, d, scale); break;
          default: sign_grad_columns<T, kSignGroup>(gp, qp, kp, dqp, dkp, a, b, d, scale); break;
        }
      }
  });
}

}  // namespace

extern "C" {
int l1_vector_bytes() { return kBytes; }
void l1_distance_f32(const float* q, int64_t qs, const float* kt, float* out, int64_t P, int64_t a, int64_t b,
                     int64_t d, float scale, int threads) {
  distance(q, qs, kt, out, P, a, b, d, scale, threads);
}
void l1_distance_f64(const double* q, int64_t qs, const double* kt, double* out, int64_t P, int64_t a, int64_t b,
                     int64_t d, double scale, int threads) {
  distance(q, qs, kt, out, P, a, b, d, scale, threads);
}
void l1_sign_grad_f32(const float* g, const float* q, int64_t qs, const float* k, float* dq, float* dk, int64_t P,
                      int64_t a, int64_t b, int64_t d, float scale, int threads) {
  sign_grad(g, q, qs, k, dq, dk, P, a, b, d, scale, threads);
}
void l1_sign_grad_f64(const double* g, const double* q, int64_t qs, const double* k, double* dq, double* dk,
                      int64_t P, int64_t a, int64_t b, int64_t d, double scale, int threads) {
  sign_grad(g, q, qs, k, dq, dk, P, a, b, d, scale, threads);
}
}
