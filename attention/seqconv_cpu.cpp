// CPU kernels of Nyström's depthwise sequence conv (attention/nystrom.py, SequenceConv; docs/design.md §2).
// Built with attention/l1_cpu.py's build() and called through ctypes. Per problem p = (b, h) of P = B*H, rows of d
// contiguous values, odd kernel size K, half = K / 2, zero outside [0, n):
//   conv:        y[p, i] = base[p, i] + out_mask[b, i] * sum_t w[h, t] * in_mask[b, i + t - half] * x[p, i + t - half]
//   weight_grad: gw[p, t] = sum_i in_mask[b, i + t - half] * (g[p, i] . x[p, i + t - half])
// x, base, y, g: row strides and (b, h) strides in elements (any layout with contiguous rows); masks (B, n) of
// 0/1 or null; w (H, K); gw (P, K). GCC vector extensions of l1_cpu.py's register width (-DLRA_VECTOR_BYTES):
// tiles of 4 output rows keep their accumulators in registers across the K taps.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

#ifndef LRA_VECTOR_BYTES
#define LRA_VECTOR_BYTES 16
#endif
constexpr int kBytes = LRA_VECTOR_BYTES;  // one register of the instruction set l1_cpu.py compiles for
constexpr int kRows = 4;                  // output rows per tile: kRows x (vectors of d) independent accumulators

template <typename T> struct Simd;
template <> struct Simd<float> { typedef float vec __attribute__((vector_size(kBytes))); };
template <> struct Simd<double> { typedef double vec __attribute__((vector_size(kBytes))); };
template <typename T> using vec = typename Simd<T>::vec;
template <typename T> constexpr int W = kBytes / sizeof(T);
template <typename T> inline vec<T> load(const T* p) {
  vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T> inline void store(T* p, vec<T> v) { std::memcpy(p, &v, sizeof v); }
template <typename T> inline vec<T> splat(T x) { return x - vec<T>{}; }

struct Layout {  // element strides of a (B, H, n, d) tensor with contiguous rows
  int64_t b, h, row;
};

template <typename F> void parallel(int64_t n, int threads, F f) {
  int64_t parts = std::max<int64_t>(1, std::min<int64_t>(threads, n));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < parts; ++t) pool.emplace_back(f, n * t / parts, n * (t + 1) / parts);
  f(0, n / parts);
  for (auto& worker : pool) worker.join();
}

// R output rows from i: s[r][c] = sum_t coef(t, j) x[j, c], j = i + r + t - half in [0, n), for the columns
// [c0, c0 + W) (vector) or c0 alone (scalar tail); coefficients w[t] * in_mask[j]. Accumulators stay in registers.
template <typename T, int R, typename A, typename L>
inline void tile(const T* xp, int64_t xrow, const T* w, const T* im, int64_t i, int64_t n, int64_t K, int64_t half,
                 int64_t c0, A (&acc)[R], L ld) {
  for (int r = 0; r < R; ++r) acc[r] = A{};
  for (int64_t t = 0; t < K; ++t) {
    for (int r = 0; r < R; ++r) {
      const int64_t j = i + r + t - half;
      if (j < 0 || j >= n) continue;
      const T coef = im ? w[t] * im[j] : w[t];
      acc[r] += coef * ld(xp + j * xrow + c0);
    }
  }
}

template <typename T>
void conv(const T* x, Layout xl, const T* w, const T* in_mask, const T* out_mask, const T* base, Layout bl, T* y,
          Layout yl, int64_t B, int64_t H, int64_t n, int64_t d, int64_t K, int threads) {
  const int64_t half = K / 2;
  parallel(B * H, threads, [=](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t b = p / H, h = p % H;
      const T* xp = x + b * xl.b + h * xl.h;
      const T* wh = w + h * K;
      const T* im = in_mask ? in_mask + b * n : nullptr;
      const T* om = out_mask ? out_mask + b * n : nullptr;
      auto finish = [&](int64_t i, int64_t c0, auto value, auto st) {  // base + out_mask * value, stored
        const T scale = om ? om[i] : T(1);
        T* yr = y + b * yl.b + h * yl.h + i * yl.row + c0;
        if (base) {
          st(yr, decltype(value)(scale * value) + [&] {
            const T* br = base + b * bl.b + h * bl.h + i * bl.row + c0;
            if constexpr (std::is_same_v<decltype(value), T>) return *br; else return load(br);
          }());
        } else {
          st(yr, decltype(value)(scale * value));
        }
      };
      auto vload = [](const T* q) { return load(q); };
      auto sload = [](const T* q) { return *q; };
      auto vstore = [](T* q, vec<T> v) { store(q, v); };
      auto sstore = [](T* q, T v) { *q = v; };
      const int64_t dv = d - d % W<T>;
      int64_t i = 0;
      for (; i + kRows <= n; i += kRows) {
        for (int64_t c0 = 0; c0 < dv; c0 += W<T>) {
          vec<T> acc[kRows];
          tile<T, kRows>(xp, xl.row, wh, im, i, n, K, half, c0, acc, vload);
          for (int r = 0; r < kRows; ++r) finish(i + r, c0, acc[r], vstore);
        }
        for (int64_t c0 = dv; c0 < d; ++c0) {
          T acc[kRows];
          tile<T, kRows>(xp, xl.row, wh, im, i, n, K, half, c0, acc, sload);
          for (int r = 0; r < kRows; ++r) finish(i + r, c0, acc[r], sstore);
        }
      }
      for (; i < n; ++i) {
        for (int64_t c0 = 0; c0 < dv; c0 += W<T>) {
          vec<T> acc[1];
          tile<T, 1>(xp, xl.row, wh, im, i, n, K, half, c0, acc, vload);
          finish(i, c0, acc[0], vstore);
        }
        for (int64_t c0 = dv; c0 < d; ++c0) {
          T acc[1];
          tile<T, 1>(xp, xl.row, wh, im, i, n, K, half, c0, acc, sload);
          finish(i, c0, acc[0], sstore);
        }
      }
    }
  });
}

template <typename T>
void weight_grad(const T* g, Layout gl, const T* x, Layout xl, const T* in_mask, T* gw, int64_t B, int64_t H,
                 int64_t n, int64_t d, int64_t K, int threads) {
  constexpr int kTaps = 8;  // taps per pass over the rows: one vector accumulator each, each row of g loaded once
  const int64_t half = K / 2, dv = d - d % W<T>;
  parallel(B * H, threads, [=](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t b = p / H, h = p % H;
      const T* im = in_mask ? in_mask + b * n : nullptr;
      const T* gp = g + b * gl.b + h * gl.h;
      const T* xp = x + b * xl.b + h * xl.h;
      for (int64_t t0 = 0; t0 < K; t0 += kTaps) {
        const int taps = (int)std::min<int64_t>(kTaps, K - t0);
        vec<T> acc[kTaps] = {};
        T tail[kTaps] = {};
        for (int64_t i = 0; i < n; ++i) {
          const T* gr = gp + i * gl.row;
          for (int64_t c = 0; c < dv; c += W<T>) {
            const vec<T> gv = load(gr + c);
            for (int u = 0; u < taps; ++u) {
              const int64_t j = i + t0 + u - half;
              if (j < 0 || j >= n) continue;
              acc[u] += (im ? im[j] : T(1)) * (gv * load(xp + j * xl.row + c));
            }
          }
          for (int64_t c = dv; c < d; ++c)
            for (int u = 0; u < taps; ++u) {
              const int64_t j = i + t0 + u - half;
              if (j >= 0 && j < n) tail[u] += (im ? im[j] : T(1)) * gr[c] * xp[j * xl.row + c];
            }
        }
        for (int u = 0; u < taps; ++u) {
          T total = tail[u];
          for (int e = 0; e < W<T>; ++e) total += acc[u][e];
          gw[p * K + t0 + u] = total;
        }
      }
    }
  });
}

}  // namespace

extern "C" {
#define LRA_SEQCONV(T, suffix)                                                                                   \
  void seqconv_##suffix(const T* x, int64_t xb, int64_t xh, int64_t xr, const T* w, const T* in_mask,            \
                        const T* out_mask, const T* base, int64_t bb, int64_t bh, int64_t br, T* y, int64_t yb,  \
                        int64_t yh, int64_t yr, int64_t B, int64_t H, int64_t n, int64_t d, int64_t K,           \
                        int threads) {                                                                           \
    conv<T>(x, {xb, xh, xr}, w, in_mask, out_mask, base, {bb, bh, br}, y, {yb, yh, yr}, B, H, n, d, K, threads); \
  }                                                                                                              \
  void seqconv_weight_grad_##suffix(const T* g, int64_t gb, int64_t gh, int64_t gr, const T* x, int64_t xb,      \
                                    int64_t xh, int64_t xr, const T* in_mask, T* gw, int64_t B, int64_t H,       \
                                    int64_t n, int64_t d, int64_t K, int threads) {                              \
    weight_grad<T>(g, {gb, gh, gr}, x, {xb, xh, xr}, in_mask, gw, B, H, n, d, K, threads);                       \
  }
LRA_SEQCONV(float, f32)
LRA_SEQCONV(double, f64)
}
