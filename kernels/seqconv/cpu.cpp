// CPU kernels of Nyström's sequence operations (attention/nystrom.py; docs/design.md §2): the depthwise conv
// (SequenceConv) and the sums of the landmark segments (segment_means).
// Built and bound by kernels/seqconv/cpu.py (plain C ABI through ctypes). Per problem p = (b, h) of P = B*H, rows of d
// contiguous values, odd kernel size K, half = K / 2, zero outside [0, n):
//   conv:        y[p, i] = base[p, i] + out_mask[b, i] * sum_t w[h, t] * in_mask[b, i + t - half] * x[p, i + t - half]
//   weight_grad: gw[p, t] = sum_i in_mask[b, i + t - half] * (g[p, i] . x[p, i + t - half])
//   segment_sums: sums[p, s] = sum_{i: segment[b, i] = s} x[p, i] for s < m
// x, base, y, g: row strides and (b, h) strides in elements (any layout with contiguous rows); masks (B, n) of
// 0/1 or null; w (H, K); gw (P, K). Tiles of output rows (vectors of simd.h) keep their accumulators in registers while each input row in their reach is loaded once.
#include <type_traits>

#include "simd.h"

namespace {

using namespace simd;

struct Layout {  // element strides of a (B, H, n, d) tensor with contiguous rows
  int64_t b, h, row;
};

// R output rows from i, V vectors of columns from c0 (or V scalar columns: A = T): acc[r][v] = sum_t w[t] *
// in_mask[j] * x[j, column], j = i + r + t - half in [0, n). Each input row j is loaded (and masked) once per tile
// and multiplied into the R outputs it reaches, with the taps' weights splatted once per problem (wv), so the
// inner loop is one FMA per load of a weight vector; for each output the taps are still summed in order of t.
template <typename T, int R, int V, typename A, typename Ld>
inline void tile(const T* xp, int64_t xrow, const A* wv, const T* im, int64_t i, int64_t n, int64_t K,
                 int64_t half, int64_t c0, A (&acc)[R][V], Ld ld) {
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = A{};
  // Input rows j reach outputs r with 0 <= t = j - i - r + half < K: all R of them for j in [full_lo, full_hi),
  // some near the ends (checked per r there only).
  const int64_t first = std::max<int64_t>(0, i - half), last = std::min<int64_t>(n, i + R - 1 - half + K);
  const int64_t full_lo = std::clamp(i + R - 1 - half, first, last), full_hi = std::clamp(i - half + K, full_lo, last);
  auto input = [&](int64_t j, A (&xv)[V]) {  // row j times its mask; false for a masked row (it adds nothing)
    const T keep = im ? im[j] : T(1);
    for (int v = 0; v < V; ++v) xv[v] = keep * ld(xp + j * xrow + c0 + v * (int64_t)(sizeof(A) / sizeof(T)));
    return keep != T(0);
  };
  auto edge = [&](int64_t j) {
    A xv[V];
    if (!input(j, xv)) return;
    for (int r = 0; r < R; ++r) {
      const int64_t t = j - i - r + half;
      if (t < 0 || t >= K) continue;
      for (int v = 0; v < V; ++v) acc[r][v] += wv[t] * xv[v];
    }
  };
  for (int64_t j = first; j < full_lo; ++j) edge(j);
  for (int64_t j = full_lo; j < full_hi; ++j) {
    A xv[V];
    if (!input(j, xv)) continue;
    const A* wj = wv + (j - i + half);  // tap of output r: wj[-r]
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) acc[r][v] += wj[-r] * xv[v];
  }
  for (int64_t j = full_hi; j < last; ++j) edge(j);
}

// Output rows per tile: R x 2 vector accumulators, as many as the registers allow beside the inputs.
constexpr int kTileRows = kBytes == 64 ? 8 : 4;
constexpr int64_t kAhead = 16;  // rows between the tile computed and the rows prefetched (simd.h)

template <typename T>
void conv(const T* x, Layout xl, const T* w, const T* in_mask, const T* out_mask, const T* base, Layout bl, T* y,
          Layout yl, int64_t B, int64_t H, int64_t n, int64_t d, int64_t K, int threads) {
  const int64_t half = K / 2;
  parallel(B * H, threads, [=](int64_t lo, int64_t hi) {
    std::vector<vec<T>> wv(K);
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t b = p / H, h = p % H;
      const T* xp = x + b * xl.b + h * xl.h;
      for (int64_t t = 0; t < K; ++t) wv[t] = splat(w[h * K + t]);
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
      // R rows from i: the columns in chunks of two vectors, one vector, then scalars.
      auto rows = [&](auto tile_rows, int64_t i) {
        constexpr int R = decltype(tile_rows)::value;
        int64_t c0 = 0;
        for (; c0 + 2 * W<T> <= d; c0 += 2 * W<T>) {
          vec<T> acc[R][2];
          tile<T, R, 2>(xp, xl.row, wv.data(), im, i, n, K, half, c0, acc, vload);
          for (int r = 0; r < R; ++r) finish(i + r, c0, acc[r][0], vstore), finish(i + r, c0 + W<T>, acc[r][1], vstore);
        }
        for (; c0 + W<T> <= d; c0 += W<T>) {
          vec<T> acc[R][1];
          tile<T, R, 1>(xp, xl.row, wv.data(), im, i, n, K, half, c0, acc, vload);
          for (int r = 0; r < R; ++r) finish(i + r, c0, acc[r][0], vstore);
        }
        for (; c0 < d; ++c0) {
          T acc[R][1];
          tile<T, R, 1>(xp, xl.row, w + h * K, im, i, n, K, half, c0, acc, sload);
          for (int r = 0; r < R; ++r) finish(i + r, c0, acc[r][0], sstore);
        }
      };
      int64_t i = 0;
      for (; i + kTileRows <= n; i += kTileRows) {
        const int64_t from = i + kAhead, to = i + kAhead + kTileRows;  // the rows met kAhead rows on
        prefetch_rows(xp + half * xl.row, xl.row, from, to, n - half, d);  // x rows r + half < n
        if (base) prefetch_rows(base + b * bl.b + h * bl.h, bl.row, from, to, n, d);
        prefetch_rows<true>(y + b * yl.b + h * yl.h, yl.row, from, to, n, d);
        rows(std::integral_constant<int, kTileRows>{}, i);
      }
      for (; i < n; ++i) rows(std::integral_constant<int, 1>{}, i);
    }
  });
}

template <typename T>
void weight_grad(const T* g, Layout gl, const T* x, Layout xl, const T* in_mask, T* gw, int64_t B, int64_t H,
                 int64_t n, int64_t d, int64_t K, int threads) {
  // Input-row-major: each row j of x is loaded (and masked) once per group of kTaps taps and multiplied with the
  // rows i = j - t + half of g it meets, one FMA per loaded g vector; kTaps vector sums (all columns summed into
  // the tap's vector) stay in registers over all rows.
  constexpr int kTaps = kBytes == 64 ? 16 : 8;
  constexpr int kChunk = 4;  // x vectors held per row
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
        // rows j whose every tap u of the group meets a row i = j - t0 - u + half in [0, n)
        const int64_t full_lo = std::clamp<int64_t>(t0 + taps - 1 - half, 0, n);
        const int64_t full_hi = std::clamp<int64_t>(n + t0 - half, full_lo, n);
        for (int64_t c = 0; c < dv; c += kChunk * W<T>) {
          const int cv = (int)std::min<int64_t>(kChunk, (dv - c) / W<T>);
          auto row = [&](int64_t j, bool checked) {
            const T keep = im ? im[j] : T(1);
            if (keep == T(0)) return;  // a masked row of x adds nothing
            vec<T> xv[kChunk];
            for (int e = 0; e < cv; ++e) xv[e] = keep * load(xp + j * xl.row + c + e * W<T>);
            const T* gj = gp + (j - t0 + half) * gl.row + c;  // row i of tap u: gj - u * gl.row
            for (int u = 0; u < taps; ++u) {
              if (checked && (j - t0 - u + half < 0 || j - t0 - u + half >= n)) continue;
              for (int e = 0; e < cv; ++e) acc[u] += load(gj - u * gl.row + e * W<T>) * xv[e];
            }
          };
          for (int64_t j = 0; j < full_lo; ++j) row(j, true);
          for (int64_t j = full_lo; j < full_hi; ++j) row(j, false);
          for (int64_t j = full_hi; j < n; ++j) row(j, true);
        }
        for (int64_t j = 0; j < n; ++j)  // scalar tail columns
          for (int64_t c = dv; c < d; ++c)
            for (int u = 0; u < taps; ++u) {
              const int64_t i = j - t0 - u + half;
              if (i >= 0 && i < n) tail[u] += (im ? im[j] : T(1)) * gp[i * gl.row + c] * xp[j * xl.row + c];
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

// sums[p, s] = sum of the rows x[p, i] with segment[b, i] = s, for s < m (rows of other segments, e.g. padding
// put in segment m, are skipped), added in order of i; sums (P, m, d) contiguous.
template <typename T>
void segment_sums(const T* x, Layout xl, const int64_t* segment, T* sums, int64_t B, int64_t H, int64_t n,
                  int64_t d, int64_t m, int threads) {
  const int64_t dv = d - d % W<T>;
  parallel(B * H, threads, [=](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t b = p / H, h = p % H;
      const T* xp = x + b * xl.b + h * xl.h;
      const int64_t* seg = segment + b * n;
      T* out = sums + p * m * d;
      std::fill(out, out + m * d, T(0));
      for (int64_t i = 0, end; i < n; i = end) {  // runs of rows in one segment, summed in registers
        for (end = i + 1; end < n && seg[end] == seg[i];) ++end;
        if (seg[i] < 0 || seg[i] >= m) continue;
        T* o = out + seg[i] * d;
        const T* xi = xp + i * xl.row;
        int64_t c = 0;
        for (; c + 2 * W<T> <= dv; c += 2 * W<T>) {  // two independent addition chains
          vec<T> a0 = load(o + c), a1 = load(o + c + W<T>);
          for (int64_t r = 0; r < end - i; ++r) a0 += load(xi + r * xl.row + c), a1 += load(xi + r * xl.row + c + W<T>);
          store(o + c, a0), store(o + c + W<T>, a1);
        }
        for (; c < dv; c += W<T>) {
          vec<T> a0 = load(o + c);
          for (int64_t r = 0; r < end - i; ++r) a0 += load(xi + r * xl.row + c);
          store(o + c, a0);
        }
        for (; c < d; ++c) {
          T a0 = o[c];
          for (int64_t r = 0; r < end - i; ++r) a0 += xi[r * xl.row + c];
          o[c] = a0;
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
  }                                                                                                              \
  void segment_sums_##suffix(const T* x, int64_t xb, int64_t xh, int64_t xr, const int64_t* segment, T* sums,    \
                             int64_t B, int64_t H, int64_t n, int64_t d, int64_t m, int threads) {               \
    segment_sums<T>(x, {xb, xh, xr}, segment, sums, B, H, n, d, m, threads);                                    \
  }
LRA_SEQCONV(float, f32)
LRA_SEQCONV(double, f64)
}
