// CPU kernels of CUR's landmark selection (attention/selection.py), float32, built and bound by
// kernels/selection/cpu.py (plain C ABI through ctypes):
// * landmarks_abs_row_sums: sum_e |x_ie| per row (CUR's `abs` selection priorities) in one pass, no |X| tensor;
// * landmarks_top_indices: per row of priorities, the m highest among real tokens, ascending, ties to the lowest
//   index (selection._top's rule: NaN ranks as +inf, padding as -inf, force_cls puts index 0 first), by a
//   selection (nth_element) of the m-th largest and one scan, where the PyTorch form runs a dozen n-sized ops.
#include <functional>

#include "landmark_attention.h"

namespace {

using namespace landmarks;

constexpr int64_t kAhead = 16;  // rows between the one summed and the one prefetched

// Rows [lo, hi) of x (row i of problem i / n at base + (i / n / heads) * s0 + (i / n % heads) * s1 + (i % n) * s2).
void abs_row_sums(const float* x, const int64_t* strides, float* out, int64_t heads, int64_t n, int64_t d,
                  int64_t lo, int64_t hi) {
  for (int64_t row = lo; row < hi;) {  // one problem's rows at a time: no division per row
    const int64_t p = row / n, end = std::min(hi, (p + 1) * n);
    const float* xp = x + p / heads * strides[0] + p % heads * strides[1];
    for (int64_t i = row % n; row < end; ++row, ++i) {
      prefetch_rows(xp, strides[2], i + kAhead, i + kAhead + 1, n, d);
      const float* xi = xp + i * strides[2];
      vec total = {};
      int64_t e = 0;
      for (; e + W <= d; e += W) total += vabs(load(xi + e));
      float sum = hsum(total)[0];
      for (; e < d; ++e) sum += std::abs(xi[e]);
      out[row] = sum;
    }
  }
}

// Row `priority` (n) with its key mask (n bytes, 0 = padding): the m indices of selection._top, ascending, in out.
void top_indices(const float* priority, const uint8_t* real, int64_t n, int64_t m, bool force_cls, float* ranked,
                 float* scratch, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float p = priority[i];
    ranked[i] = !real[i] ? -INFINITY : std::isnan(p) ? INFINITY : p;
  }
  if (force_cls && n > 0) ranked[0] = INFINITY;
  std::copy(ranked, ranked + n, scratch);
  std::nth_element(scratch, scratch + m - 1, scratch + n, std::greater<float>());
  const float threshold = scratch[m - 1];  // the m-th largest
  int64_t ties = m - std::count_if(ranked, ranked + n, [threshold](float p) { return p > threshold; });
  for (int64_t i = 0, slot = 0; i < n && slot < m; ++i)
    if (ranked[i] > threshold || (ranked[i] == threshold && ties-- > 0)) out[slot++] = i;
}

}  // namespace

extern "C" {
int landmarks_selection_vector_bytes() { return kBytes; }

// out (batch, heads, n) contiguous = sum over the last dimension of |x|, x (batch, heads, n, d) at strides
// (last stride 1). Returns 0.
int landmarks_abs_row_sums_f32(const float* x, const int64_t* strides, float* out, int64_t batch, int64_t heads,
                                int64_t n, int64_t d, int threads) {
  const int64_t rows = batch * heads * n, parts = std::max<int64_t>(1, std::min<int64_t>(threads, rows / 4096));
  parallel(parts, threads, [=](int64_t lo, int64_t hi) {
    abs_row_sums(x, strides, out, heads, n, d, rows * lo / parts, rows * hi / parts);
  });
  return 0;
}

// out (batch, heads, m) = the m indices selection._top picks from priority (batch, heads, n) contiguous with
// real (batch, n) bytes (1 = real token), 1 <= m <= n. Returns 0, or -1 for m outside [1, n].
int landmarks_top_indices_f32(const float* priority, const uint8_t* real, int64_t* out, int64_t batch,
                              int64_t heads, int64_t n, int64_t m, int force_cls, int threads) {
  if (m < 1 || m > n) return -1;
  parallel(batch * heads, threads, [=](int64_t lo, int64_t hi) {
    std::vector<float> ranked(n), scratch(n);
    for (int64_t p = lo; p < hi; ++p)
      top_indices(priority + p * n, real + p / heads * n, n, m, force_cls, ranked.data(), scratch.data(),
                  out + p * m);
  });
  return 0;
}
}
