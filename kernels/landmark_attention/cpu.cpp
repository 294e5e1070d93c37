// CPU kernels of landmark attention, float32, built and bound by kernels/landmark_attention/cpu.py (plain C ABI
// through ctypes; the math is in its docstring; selecting the landmarks: kernels/selection/cpu.cpp):
// * landmarks_few_keys_attend / landmarks_few_queries_attend: the forward of softmax attention when the keys
//   (C W of CUR and Nyström) or the queries (R V, Nyström's k3 V) are at most 128 (Proxyformer keeps SDPA: its
//   training step was slower with them, docs/bench.md). Per problem p (a (batch, head) pair) and query row i:
//     s_ij = scale * q_i . k_j + bias_j,   y_i = sum_j exp(s_ij - max_j s_ij) v_j / sum_j exp(s_ij - max_j s_ij)
//   with bias 0 or -inf per key; with l1 != 0 the score is L1 distance's s_ij = scale * ||q_i - k_j||_1 + bias_j
//   (EcoTransformer; scale = -lambda / sqrt(d) from the caller), everything else the same. They write max_j s_ij
//   and sum_j exp(s_ij - max) per row, from which the caller forms lse = max + log(sum) where backward needs it;
//   a row whose keys are all masked gets y_i = 0, max 0 and sum 1 (lse 0), as ATen's flash kernel gives it. The
//   few side is transposed and zero-padded by the caller (kt (P, d, mp) or qt (P, d, mq), mp and mq a power of two
//   times the vector width); everything else is addressed by strides (rows of d contiguous floats, d % W == 0).
//   Exponentials are a vector polynomial (Cephes' expf), row reductions butterfly shuffles.
// Vector type, exponential, reductions and the thread helper: landmark_attention.h and simd.h.
#include "landmark_attention.h"

namespace {

using namespace landmarks;

struct Problem {
  const float *q, *kt, *kt_sum, *bias, *v;  // kt_sum: lane_sums of kt (L1 scores only)
  float *y, *row_max, *row_sum;
  int64_t q_row, v_row, y_row;
};

// Softmax weights of RL query rows (from row r0 of a tile) over the problem's mp = MV * W keys into weights (mp
// floats a row), and those rows' maxima and sums.
template <int RL, int MV, bool L1>
void softmax_rows(const Problem& p, int r0, int64_t d, float scale, float (*weights)[MV * W]) {
  vec logits[RL][MV];
  row_products<RL, MV, L1>(p.q + r0 * p.q_row, p.q_row, p.kt, d, logits, p.kt_sum);
  // One step at a time for all RL rows so that their dependency chains interleave.
  vec top[RL], total[RL];
  for (int r = 0; r < RL; ++r) {
    top[r] = splat(-INFINITY);
    for (int u = 0; u < MV; ++u) {
      logits[r][u] = logits[r][u] * scale + load(p.bias + u * W);
      top[r] = vmax(top[r], logits[r][u]);
    }
  }
  for (int r = 0; r < RL; ++r) top[r] = hmax(top[r]);
  for (int r = 0; r < RL; ++r) top[r] = top[r] == -INFINITY ? vec{} : top[r];  // no real key: all weights 0
  for (int r = 0; r < RL; ++r) {
    total[r] = vec{};
    for (int u = 0; u < MV; ++u) {
      logits[r][u] = vexp(logits[r][u] - top[r]);
      total[r] += logits[r][u];
    }
  }
  for (int r = 0; r < RL; ++r) total[r] = hsum(total[r]);
  for (int r = 0; r < RL; ++r) {
    const vec inverse = total[r] == vec{} ? vec{} : 1.0f / total[r];
    for (int u = 0; u < MV; ++u) store(&weights[r0 + r][u * W], logits[r][u] * inverse);
    p.row_max[r0 + r] = top[r][0];
    p.row_sum[r0 + r] = total[r][0] == 0.0f ? 1.0f : total[r][0];
  }
}

// R query rows of one problem against its mp = MV * W keys (m of them real), d / W vectors of output each: their
// weights RL rows at a time (RL x MV logit vectors in registers), then their outputs together.
template <int R, int MV, bool L1>
void rows(const Problem& p, int64_t m, int64_t d, float scale) {
  constexpr int mp = MV * W, RL = std::min(R, std::max(1, kAccumulators / MV));
  static_assert(R % RL == 0, "a tile's rows are whole logit tiles");
  alignas(64) float weights[R][mp];
  for (int r0 = 0; r0 < R; r0 += RL) softmax_rows<RL, MV, L1>(p, r0, d, scale, weights);
  // Output columns two vectors at a time; even and odd keys go to separate accumulators (R x 2 x 2 of them),
  // so that even R = 1 or 2 keeps enough independent FMA chains in flight.
  for (int64_t c = 0; c < d; c += 2 * W) {
    const bool two = c + 2 * W <= d;
    vec out[R][2][2] = {};
    int64_t j = 0;
    for (; j + 2 <= m; j += 2)
      for (int parity = 0; parity < 2; ++parity) {
        const float* vj = p.v + (j + parity) * p.v_row + c;
        vec v0 = load(vj), v1 = two ? load(vj + W) : vec{};
        for (int r = 0; r < R; ++r) {
          vec w = splat(weights[r][j + parity]);
          out[r][parity][0] += w * v0;
          out[r][parity][1] += w * v1;
        }
      }
    if (j < m) {
      const float* vj = p.v + j * p.v_row + c;
      vec v0 = load(vj), v1 = two ? load(vj + W) : vec{};
      for (int r = 0; r < R; ++r) {
        out[r][0][0] += splat(weights[r][j]) * v0;
        out[r][0][1] += splat(weights[r][j]) * v1;
      }
    }
    for (int r = 0; r < R; ++r) {
      store(p.y + r * p.y_row + c, out[r][0][0] + out[r][1][0]);
      if (two) store(p.y + r * p.y_row + c + W, out[r][0][1] + out[r][1][1]);
    }
  }
}

constexpr int64_t kAhead = 16;  // rows between the ones computed and the ones prefetched

template <int MV, bool L1>
void attend(const Problem* problems, int64_t P, int64_t n, int64_t m, int64_t d, float scale, int threads) {
  // Rows per tile: the logit tiles' (kAccumulators / MV), and at least 2, so that with 16 registers (m = 64 at 8
  // floats a vector: one row's logits fill half of them) two rows still share each loaded vector of V.
  constexpr int R = std::max(2, kAccumulators / MV);
  const int64_t blocks = (n + R - 1) / R;
  parallel(P * blocks, threads, [=](int64_t lo, int64_t hi) {
    for (int64_t task = lo; task < hi;) {  // one problem's blocks at a time: no division per block
      const int64_t problem = task / blocks, end = std::min(hi, (problem + 1) * blocks);
      for (int64_t i = task % blocks * R; task < end; ++task, i += R) {
        Problem p = problems[problem];
        prefetch_rows(p.q, p.q_row, i + kAhead, i + kAhead + R, n, d);
        prefetch_rows<true>(p.y, p.y_row, i + kAhead, i + kAhead + R, n, d);
        p.q += i * p.q_row;
        p.y += i * p.y_row;
        p.row_max += i;
        p.row_sum += i;
        if (i + R <= n) {
          rows<R, MV, L1>(p, m, d, scale);
        } else {
          for (int64_t row = i; row < n; ++row, p.q += p.q_row, p.y += p.y_row, ++p.row_max, ++p.row_sum)
            rows<1, MV, L1>(p, m, d, scale);
        }
      }
    }
  });
}

// Few queries (m <= 128) against many keys, one problem: qt (d, mq) the queries transposed and zero-padded to
// mq = QV vectors; keys k and values v at row strides k_row, v_row over n keys; bias (n) 0 or -inf per key.
// Logits are vectors over the queries, so the softmax over keys is elementwise: keys go in blocks of kKeyBlock
// with running maxima and sums per query (flash attention's online softmax); a block whose keys are all masked
// is skipped. Writes the m real rows of y (row stride y_row) and row_max, row_sum (m) as the few-keys kernel.
constexpr int kKeyBlock = 32;

// The logits of Keys keys (rows k_row apart) against the mq = QV * W queries of qt, scaled and biased (bias of
// each key), into Keys rows of block (mq floats apart).
template <int Keys, int QV, bool L1>
void key_logits(const float* k, int64_t k_row, const float* qt, const float* qt_sum, const float* bias, int64_t d,
                float scale, float* block) {
  vec acc[Keys][QV];
  row_products<Keys, QV, L1>(k, k_row, qt, d, acc, qt_sum);
  for (int t = 0; t < Keys; ++t)
    for (int u = 0; u < QV; ++u) store(block + t * QV * W + u * W, acc[t][u] * scale + bias[t]);
}

template <int QV, bool L1>
void few_queries(const float* qt, const float* k, int64_t k_row, const float* v, int64_t v_row, const float* bias,
                 float* y, int64_t y_row, float* row_max, float* row_sum, int64_t m, int64_t n, int64_t d,
                 float scale, float* scratch) {
  // G keys per logit tile, RQ query rows per output tile (2 column vectors each)
  constexpr int mq = QV * W, G = std::max(1, kAccumulators / QV), RQ = kAccumulators / 2;
  static_assert(RQ <= W, "an output tile's rows i..i+RQ-1 must stay inside the padded queries (mq % W == 0)");
  float* block = scratch;                  // (kKeyBlock, mq): logits, then weights, of a key block
  float* out = scratch + kKeyBlock * mq;   // (mq, d): unnormalised outputs
  float* factor = out + mq * d;            // (mq): rescaling of out by the new maxima
  std::fill(out, out + mq * d, 0.0f);
  alignas(64) float qt_sum[mq];  // L1 scores: lane_sums of qt
  if constexpr (L1) lane_sums(qt, d, mq, qt_sum);
  vec top[QV], total[QV];
  for (int u = 0; u < QV; ++u) top[u] = splat(-INFINITY), total[u] = vec{};
  for (int64_t j0 = 0; j0 < n; j0 += kKeyBlock) {
    const int64_t keys = std::min<int64_t>(kKeyBlock, n - j0);
    prefetch_rows(k, k_row, j0 + kKeyBlock, j0 + 2 * kKeyBlock, n, d);  // the next block's keys and values
    prefetch_rows(v, v_row, j0 + kKeyBlock, j0 + 2 * kKeyBlock, n, d);
    if (std::all_of(bias + j0, bias + j0 + keys, [](float b) { return b == -INFINITY; })) continue;
    int64_t t = 0;  // logits of G keys x all queries at a time
    for (; t + G <= keys; t += G)
      key_logits<G, QV, L1>(k + (j0 + t) * k_row, k_row, qt, qt_sum, bias + j0 + t, d, scale, block + t * mq);
    for (; t < keys; ++t)
      key_logits<1, QV, L1>(k + (j0 + t) * k_row, k_row, qt, qt_sum, bias + j0 + t, d, scale, block + t * mq);
    for (int u = 0; u < QV; ++u) {  // per query: new maximum, rescaling factor, weights, running sum
      vec block_top = splat(-INFINITY);
      for (int64_t t = 0; t < keys; ++t) block_top = vmax(block_top, load(block + t * mq + u * W));
      const vec new_top = vmax(top[u], block_top);
      const vec shift = new_top == -INFINITY ? vec{} : new_top;  // no real key yet: exp(-inf - 0) = 0
      const vec rescale = vexp(top[u] - shift);
      vec sum = {};
      for (int64_t t = 0; t < keys; ++t) {
        vec weight = vexp(load(block + t * mq + u * W) - shift);
        store(block + t * mq + u * W, weight);
        sum += weight;
      }
      total[u] = total[u] * rescale + sum;
      top[u] = new_top;
      store(factor + u * W, rescale);
    }
    // out rows i..i+RQ-1, two column vectors at a time: factor * out + weights^T V over the block
    for (int64_t i = 0; i < m; i += RQ) {
      const int rows = static_cast<int>(std::min<int64_t>(RQ, m - i));
      for (int64_t c = 0; c < d; c += 2 * W) {
        const bool two = c + 2 * W <= d;
        vec acc[RQ][2];
        for (int r = 0; r < RQ; ++r) {
          const vec f = splat(factor[i + r]);
          acc[r][0] = r < rows ? load(out + (i + r) * d + c) * f : vec{};
          acc[r][1] = r < rows && two ? load(out + (i + r) * d + c + W) * f : vec{};
        }
        for (int64_t t = 0; t < keys; ++t) {
          const float* vt = v + (j0 + t) * v_row + c;
          const vec v0 = load(vt), v1 = two ? load(vt + W) : vec{};
          for (int r = 0; r < RQ; ++r) {
            const vec w = splat(block[t * mq + i + r]);
            acc[r][0] += w * v0;
            acc[r][1] += w * v1;
          }
        }
        for (int r = 0; r < rows; ++r) {
          store(out + (i + r) * d + c, acc[r][0]);
          if (two) store(out + (i + r) * d + c + W, acc[r][1]);
        }
      }
    }
  }
  alignas(64) float tops[mq], totals[mq];
  for (int u = 0; u < QV; ++u) store(tops + u * W, top[u]), store(totals + u * W, total[u]);
  for (int64_t i = 0; i < m; ++i) {
    const bool any = totals[i] > 0.0f;
    const vec inverse = splat(any ? 1.0f / totals[i] : 0.0f);
    for (int64_t c = 0; c < d; c += W) store(y + i * y_row + c, load(out + i * d + c) * inverse);
    row_max[i] = any ? tops[i] : 0.0f;
    row_sum[i] = any ? totals[i] : 1.0f;
  }
}

template <int QV, bool L1>
void few_queries_all(const float* qt, const float* k, const int64_t* k_strides, const float* v,
                     const int64_t* v_strides, const float* bias, int64_t bias_heads, float* y,
                     const int64_t* y_strides, float* row_max, float* row_sum, int64_t batch, int64_t heads, int64_t m,
                     int64_t n, int64_t d, float scale, int threads) {
  constexpr int mq = QV * W;
  parallel(batch * heads, threads, [=](int64_t lo, int64_t hi) {
    std::vector<float> scratch(kKeyBlock * mq + mq * d + mq + W);
    float* aligned = scratch.data();
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t b = p / heads, h = p % heads;
      few_queries<QV, L1>(qt + p * d * mq, k + b * k_strides[0] + h * k_strides[1], k_strides[2],
                      v + b * v_strides[0] + h * v_strides[1], v_strides[2], bias + (b * bias_heads + h % bias_heads) * n,
                      y + b * y_strides[0] + h * y_strides[1], y_strides[2], row_max + p * m, row_sum + p * m, m, n, d,
                      scale, aligned);
    }
  });
}

}  // namespace

extern "C" {
int landmarks_vector_bytes() { return kBytes; }

// q: (batch, heads, n, d) at strides q_strides[0..2] (last stride 1); kt (batch * heads, d, mp), bias
// (batch * heads, mp) contiguous; v at v_strides (m rows); y at y_strides; row_max, row_sum (batch * heads, n):
// lse = row_max + log(row_sum) (0 and 1 for a row without a real key, so lse = 0); l1 != 0: L1 distance scores.
// Returns 0, or -1
// when mp is not one of W, 2W, 4W, ... up to kMaxKeys or d is not a multiple of W (nothing written then).
int landmarks_few_keys_attend_f32(const float* q, const int64_t* q_strides, const float* kt, const float* bias,
                                  const float* v, const int64_t* v_strides, float* y, const int64_t* y_strides,
                                  float* row_max, float* row_sum, int64_t batch, int64_t heads, int64_t n, int64_t m,
                                  int64_t mp, int64_t d, float scale, int l1, int threads) {
  if (d % W || m > mp || mp > kMaxKeys || mp % W || !with_vectors(mp / W, [](auto) {})) return -1;
  std::vector<Problem> problems(batch * heads);
  std::vector<float> kt_sums(l1 ? batch * heads * mp : 0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t index = b * heads + h;
      if (l1) lane_sums(kt + index * d * mp, d, mp, kt_sums.data() + index * mp);
      problems[index] = Problem{q + b * q_strides[0] + h * q_strides[1], kt + index * d * mp,
                                l1 ? kt_sums.data() + index * mp : nullptr, bias + index * mp,
                                v + b * v_strides[0] + h * v_strides[1], y + b * y_strides[0] + h * y_strides[1],
                                row_max + index * n, row_sum + index * n, q_strides[2], v_strides[2], y_strides[2]};
    }
  const Problem* all = problems.data();
  const int64_t P = batch * heads;
  with_score(l1, [&](auto score) {
    with_vectors(mp / W, [&](auto mv) { attend<mv(), score()>(all, P, n, m, d, scale, threads); });
  });
  return 0;
}

// Few queries (m <= 128) against many keys: qt (batch * heads, d, mq) contiguous, k and v (batch, heads, n, d) at
// strides, bias (batch, bias_heads, n) contiguous with bias_heads 1 or heads, y at y_strides (m rows written),
// row_max and row_sum (batch * heads, m) and l1 as for the few-keys kernel. Returns 0, or -1 when mq is not one of W, 2W,
// 4W, ... up to kMaxKeys or d is not a multiple of W (nothing written then).
int landmarks_few_queries_attend_f32(const float* qt, const float* k, const int64_t* k_strides, const float* v,
                                     const int64_t* v_strides, const float* bias, int64_t bias_heads, float* y,
                                     const int64_t* y_strides, float* row_max, float* row_sum, int64_t batch,
                                     int64_t heads, int64_t m, int64_t mq, int64_t n, int64_t d, float scale,
                                     int l1, int threads) {
  if (d % W || m > mq || mq > kMaxKeys || mq % W || !with_vectors(mq / W, [](auto) {})) return -1;
  with_score(l1, [&](auto score) {
    with_vectors(mq / W, [&](auto qv) {
      few_queries_all<qv(), score()>(qt, k, k_strides, v, v_strides, bias, bias_heads, y, y_strides, row_max,
                                     row_sum, batch, heads, m, n, d, scale, threads);
    });
  });
  return 0;
}
}
