// Backward of the landmark attention kernels of cpu.cpp, float32, built and bound by
// kernels/landmark_attention/cpu.py (plain C ABI through ctypes). Per problem p (a (batch, head) pair), with the
// forward's weights P_ij = exp(s_ij - lse_i), s_ij = scale * q_i . k_j + bias_j, and dY the gradient of Y:
//   D_i = dY_i . Y_i,   dS_ij = scale * P_ij (dY_i . v_j - D_i)
//   dQ_i = sum_j dS_ij k_j,   dK_j = sum_i dS_ij q_i,   dV_j = sum_i P_ij dY_i
// (flash attention's backward, Dao et al. 2022, Alg. 4, whose result ATen's flash backward also gives). With L1
// distance scores (l1 != 0: s_ij = scale * ||q_i - k_j||_1 + bias_j, EcoTransformer) dS is the same and
//   dQ_i = sum_j dS_ij sign(q_i - k_j),   dK_j = -sum_i dS_ij sign(q_i - k_j)    (sign(0) = 0, torch.sign). The
// weights are recomputed from lse, never stored whole: a tile of rows (few keys) or a block of keys (few
// queries) at a time, and every gradient is written once, in the layout its operand came in (no copies,
// no zero-filled n x d buffers). A row without a real key has lse = 0 and all weights 0, so its gradients
// are 0. Problems run in parallel (one thread per problem at a time).
// * few keys (m <= 128 keys, CUR's and Nyström's C W): the m x d sums dK and dV stay in cache over all rows;
// * few queries (m <= 128 queries, R V and Nyström's k3 V): dQ (m x d) stays in cache, dK and dV rows are
//   written per key block; blocks whose keys are all padding get zero gradients without any arithmetic.
#include "landmark_attention.h"

namespace {

using namespace landmarks;

constexpr int kColumns = 2;                     // column vectors per register tile of the gradient sums
constexpr int kSumKeys = kBytes == 64 ? 4 : 2;   // rows j of the few side's sums per register tile

// out_j[c..] += sum_{t < count} a[t * a_stride + j] * x_t[c..] for j < m (rows x_t x_row floats apart, rows
// out_j d floats apart), and with Two the same for (b, z, acc) (z_t z_row apart) in the same loop. The sums of
// Keys rows j times Columns vectors stay in registers (compile-time counts, so that they are registers) over
// all `count` rows t, and are added to out once.
template <bool Two, int Keys, int Columns>
void add_outer_tile(const float* a, const float* x, float* out, const float* b, const float* z, float* acc,
                    int64_t a_stride, int64_t x_row, int64_t z_row, int64_t count, int64_t d, int64_t c) {
  vec sum_a[Keys][Columns] = {}, sum_b[Keys][Columns] = {};
  for (int64_t t = 0; t < count; ++t) {
    vec xs[Columns], zs[Columns];
    for (int u = 0; u < Columns; ++u) {
      xs[u] = load(x + t * x_row + c + u * W);
      if (Two) zs[u] = load(z + t * z_row + c + u * W);
    }
    for (int j = 0; j < Keys; ++j) {
      const vec wa = splat(a[t * a_stride + j]);
      for (int u = 0; u < Columns; ++u) sum_a[j][u] += wa * xs[u];
      if (Two) {
        const vec wb = splat(b[t * a_stride + j]);
        for (int u = 0; u < Columns; ++u) sum_b[j][u] += wb * zs[u];
      }
    }
  }
  for (int j = 0; j < Keys; ++j)
    for (int u = 0; u < Columns; ++u) {
      store(out + j * d + c + u * W, load(out + j * d + c + u * W) + sum_a[j][u]);
      if (Two) store(acc + j * d + c + u * W, load(acc + j * d + c + u * W) + sum_b[j][u]);
    }
}

template <bool Two, int Keys>
void add_outer_columns(const float* a, const float* x, float* out, const float* b, const float* z, float* acc,
                       int64_t a_stride, int64_t x_row, int64_t z_row, int64_t count, int64_t d) {
  int64_t c = 0;
  for (; c + kColumns * W <= d; c += kColumns * W)
    add_outer_tile<Two, Keys, kColumns>(a, x, out, b, z, acc, a_stride, x_row, z_row, count, d, c);
  for (; c < d; c += W) add_outer_tile<Two, Keys, 1>(a, x, out, b, z, acc, a_stride, x_row, z_row, count, d, c);
}

template <bool Two>
void add_outer(const float* a, const float* x, float* out, const float* b, const float* z, float* acc,
               int64_t a_stride, int64_t x_row, int64_t z_row, int64_t count, int64_t m, int64_t d) {
  int64_t j = 0;
  for (; j + kSumKeys <= m; j += kSumKeys)
    add_outer_columns<Two, kSumKeys>(a + j, x, out + j * d, Two ? b + j : b, z, Two ? acc + j * d : acc, a_stride,
                                     x_row, z_row, count, d);
  for (; j < m; ++j)
    add_outer_columns<Two, 1>(a + j, x, out + j * d, Two ? b + j : b, z, Two ? acc + j * d : acc, a_stride, x_row,
                              z_row, count, d);
}

// Weights and scaled score gradients of R rows against the MV * W lanes of the few side (few keys: query rows
// against keys; few queries: key rows against queries), with ft, gt the few side's operands transposed (d x
// MV * W, zero past its m real lanes) and x, g the rows' (q and dY, or k and v):
//   logit = x_r . ft[:, u],   P = exp(scale * logit + row_add_r + lane_add_u),
//   dS = scale * P * (g_r . gt[:, u] - row_sub_r - lane_sub_u).
// Few keys: row_add = -lse, lane_add = bias, row_sub = D, lane_sub = 0; few queries: row_add = bias,
// lane_add = -lse (-inf on padded lanes), row_sub = 0, lane_sub = D.
struct Scores {
  const float *x, *g, *ft, *ft_sum, *gt, *row_add, *lane_add, *row_sub, *lane_sub;  // ft_sum: L1 (lane_sums)
  int64_t x_row, g_row;
};

template <int R, int MV, bool L1>
void weights_and_grads(const Scores& s, float scale, int64_t d, float* weights, float* grads) {
  constexpr int mp = MV * W;
  vec acc[R][MV], dp[R][MV];
  row_products<R, MV, L1>(s.x, s.x_row, s.ft, d, acc, s.ft_sum);
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < MV; ++u) {
      acc[r][u] = vexp(acc[r][u] * scale + s.row_add[r] + load(s.lane_add + u * W));
      store(weights + r * mp + u * W, acc[r][u]);
    }
  row_products(s.g, s.g_row, s.gt, d, dp);
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < MV; ++u)
      store(grads + r * mp + u * W, acc[r][u] * (dp[r][u] - s.row_sub[r] - load(s.lane_sub + u * W)) * scale);
}

// weights_and_grads for `count` rows, R at a time (R x MV accumulators, as the forward's register tiles).
template <int MV, bool L1>
void weights_and_grads_rows(Scores s, float scale, int64_t count, int64_t d, float* weights, float* grads) {
  constexpr int R = std::max(1, kAccumulators / MV), mp = MV * W;
  int64_t r = 0;
  for (; r + R <= count; r += R, s.x += R * s.x_row, s.g += R * s.g_row, s.row_add += R, s.row_sub += R)
    weights_and_grads<R, MV, L1>(s, scale, d, weights + r * mp, grads + r * mp);
  for (; r < count; ++r, s.x += s.x_row, s.g += s.g_row, ++s.row_add, ++s.row_sub)
    weights_and_grads<1, MV, L1>(s, scale, d, weights + r * mp, grads + r * mp);
}

float dot(const float* a, const float* b, int64_t d) {
  vec sum = {};
  for (int64_t e = 0; e < d; e += W) sum += load(a + e) * load(b + e);
  return hsum(sum)[0];
}

// out_r[c..] = sum_{j < m} a[r * a_stride + j] * x_j[c..] for R rows r (rows of x x_row floats apart, rows of
// out out_row apart): R x kColumns sums in registers, each x_j vector loaded once for all R rows.
constexpr int kWeightedRows = kBytes == 64 ? 8 : 4;

template <int R, int Columns>
void weighted_rows_tile(const float* a, int64_t a_stride, const float* x, int64_t x_row, float* out,
                        int64_t out_row, int64_t m, int64_t c) {
  vec sum[R][Columns] = {};
  for (int64_t j = 0; j < m; ++j) {
    vec xj[Columns];
    for (int u = 0; u < Columns; ++u) xj[u] = load(x + j * x_row + c + u * W);
    for (int r = 0; r < R; ++r) {
      const vec w = splat(a[r * a_stride + j]);
      for (int u = 0; u < Columns; ++u) sum[r][u] += w * xj[u];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < Columns; ++u) store(out + r * out_row + c + u * W, sum[r][u]);
}

template <int R>
void weighted_rows_columns(const float* a, int64_t a_stride, const float* x, int64_t x_row, float* out,
                           int64_t out_row, int64_t m, int64_t d) {
  int64_t c = 0;
  for (; c + kColumns * W <= d; c += kColumns * W)
    weighted_rows_tile<R, kColumns>(a, a_stride, x, x_row, out, out_row, m, c);
  for (; c < d; c += W) weighted_rows_tile<R, 1>(a, a_stride, x, x_row, out, out_row, m, c);
}

void weighted_rows(const float* a, int64_t a_stride, const float* x, int64_t x_row, float* out, int64_t out_row,
                   int64_t count, int64_t m, int64_t d) {
  int64_t r = 0;
  for (; r + kWeightedRows <= count; r += kWeightedRows)
    weighted_rows_columns<kWeightedRows>(a + r * a_stride, a_stride, x, x_row, out + r * out_row, out_row, m, d);
  for (; r < count; ++r)
    weighted_rows_columns<1>(a + r * a_stride, a_stride, x, x_row, out + r * out_row, out_row, m, d);
}

// L1 scores' contraction of the score gradients g (count x m, rows a_stride apart) with the signs of x_r - f_j:
//   dx_r = sum_{j < m} g_rj sign(x_r - f_j)  (written; rows dx_row apart),   df_j -= sum_r g_rj sign(x_r - f_j)
// for `count` rows x_r (x_row apart) and m rows f_j of the few side (d floats apart, as df). R rows x Columns
// vectors of dx in registers over all j; each f_j vector loaded once for the R rows, df_j updated once per tile.
constexpr int kSignRows = 4;

template <int R, int Columns>
void sign_contract_tile(const float* g, int64_t a_stride, const float* x, int64_t x_row, const float* f, float* dx,
                        int64_t dx_row, float* df, int64_t m, int64_t d, int64_t c) {
  vec xs[R][Columns], sum[R][Columns] = {};
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < Columns; ++u) xs[r][u] = load(x + r * x_row + c + u * W);
  for (int64_t j = 0; j < m; ++j) {
    vec fj[Columns], column[Columns] = {};
    for (int u = 0; u < Columns; ++u) fj[u] = load(f + j * d + c + u * W);
    for (int r = 0; r < R; ++r) {
      const vec gr = splat(g[r * a_stride + j]);
      for (int u = 0; u < Columns; ++u) add_times_sign(gr, xs[r][u] - fj[u], sum[r][u], column[u]);
    }
    for (int u = 0; u < Columns; ++u) store(df + j * d + c + u * W, load(df + j * d + c + u * W) - column[u]);
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < Columns; ++u) store(dx + r * dx_row + c + u * W, sum[r][u]);
}

template <int R>
void sign_contract_columns(const float* g, int64_t a_stride, const float* x, int64_t x_row, const float* f, float* dx,
                           int64_t dx_row, float* df, int64_t m, int64_t d) {
  int64_t c = 0;
  for (; c + kColumns * W <= d; c += kColumns * W)
    sign_contract_tile<R, kColumns>(g, a_stride, x, x_row, f, dx, dx_row, df, m, d, c);
  for (; c < d; c += W) sign_contract_tile<R, 1>(g, a_stride, x, x_row, f, dx, dx_row, df, m, d, c);
}

void sign_contract(const float* g, int64_t a_stride, const float* x, int64_t x_row, const float* f, float* dx,
                   int64_t dx_row, float* df, int64_t count, int64_t m, int64_t d) {
  int64_t r = 0;
  for (; r + kSignRows <= count; r += kSignRows)
    sign_contract_columns<kSignRows>(g + r * a_stride, a_stride, x + r * x_row, x_row, f, dx + r * dx_row, dx_row,
                                     df, m, d);
  for (; r < count; ++r)
    sign_contract_columns<1>(g + r * a_stride, a_stride, x + r * x_row, x_row, f, dx + r * dx_row, dx_row, df, m, d);
}

struct FewKeys {
  const float *q, *dy, *y, *lse, *kt, *vt, *k, *bias;  // kt, vt (d, mp); k (m, d) rows; bias (mp)
  float *dq, *dk, *dv;                                 // dk, dv (m, d)
  int64_t q_row, dy_row, y_row, dq_row;
  const int64_t* zero_rows;                            // rows whose dY reads as 0 (zero_count of them), or null
  int64_t zero_count;
};

constexpr int kRowTile = 32;  // query rows whose weights and score gradients are formed, then summed, together

// The rows i..i+count of dY, or (when one of them is in `zeroed`) a copy of them in `tile` (d floats apart)
// with those rows 0; sets `row` to the returned rows' stride.
const float* rows_of_dy(const FewKeys& p, const uint8_t* zeroed, int64_t i, int64_t count, int64_t d, float* tile,
                        int64_t& row) {
  const float* dy = p.dy + i * p.dy_row;
  row = p.dy_row;
  if (!p.zero_count || std::none_of(zeroed + i, zeroed + i + count, [](uint8_t z) { return z; })) return dy;
  for (int64_t r = 0; r < count; ++r) {
    if (zeroed[i + r]) std::fill(tile + r * d, tile + (r + 1) * d, 0.0f);
    else std::copy(dy + r * p.dy_row, dy + r * p.dy_row + d, tile + r * d);
  }
  row = d;
  return tile;
}

template <int MV, bool L1>
void few_keys_backward(const FewKeys& p, int64_t n, int64_t m, int64_t d, float scale, float* scratch,
                       uint8_t* zeroed) {
  constexpr int mp = MV * W;
  float* weights = scratch;                 // (kRowTile, mp)
  float* grads = weights + kRowTile * mp;   // (kRowTile, mp)
  float* dy_tile = grads + kRowTile * mp;   // (kRowTile, d)
  std::fill(p.dk, p.dk + m * d, 0.0f);      // dK, dV: summed over all rows in place
  std::fill(p.dv, p.dv + m * d, 0.0f);
  std::fill(zeroed, zeroed + n, uint8_t{0});
  for (int64_t z = 0; z < p.zero_count; ++z) zeroed[p.zero_rows[z]] = 1;
  alignas(64) float neg_lse[kRowTile], delta[kRowTile], zero[mp] = {}, kt_sum[mp];
  if constexpr (L1) lane_sums(p.kt, d, mp, kt_sum);
  for (int64_t i = 0; i < n; i += kRowTile) {
    const int64_t count = std::min<int64_t>(kRowTile, n - i);
    prefetch_rows(p.q, p.q_row, i + kRowTile, i + 2 * kRowTile, n, d);  // the next tile's rows
    prefetch_rows(p.dy, p.dy_row, i + kRowTile, i + 2 * kRowTile, n, d);
    prefetch_rows(p.y, p.y_row, i + kRowTile, i + 2 * kRowTile, n, d);
    prefetch_rows<true>(p.dq, p.dq_row, i + kRowTile, i + 2 * kRowTile, n, d);
    const float* q = p.q + i * p.q_row;
    int64_t dy_row;
    const float* dy = rows_of_dy(p, zeroed, i, count, d, dy_tile, dy_row);
    for (int64_t r = 0; r < count; ++r)
      neg_lse[r] = -p.lse[i + r], delta[r] = dot(dy + r * dy_row, p.y + (i + r) * p.y_row, d);
    weights_and_grads_rows<MV, L1>(Scores{q, dy, p.kt, kt_sum, p.vt, neg_lse, p.bias, delta, zero, p.q_row, dy_row},
                                   scale, count, d, weights, grads);
    if constexpr (L1) {
      sign_contract(grads, mp, q, p.q_row, p.k, p.dq + i * p.dq_row, p.dq_row, p.dk, count, m, d);
      add_outer<false>(weights, dy, p.dv, nullptr, nullptr, nullptr, mp, dy_row, 0, count, m, d);
    } else {
      weighted_rows(grads, mp, p.k, d, p.dq + i * p.dq_row, p.dq_row, count, m, d);
      add_outer<true>(grads, q, p.dk, weights, dy, p.dv, mp, p.q_row, dy_row, count, m, d);
    }
  }
}

struct FewQueries {
  const float *qt, *dyt, *q, *dy, *neg_lse, *delta, *k, *v, *bias;  // qt, dyt (d, mq); q, dy (m, d); neg_lse,
  float *dq, *dk, *dv;                                              // delta (mq); dq (m, d)
  int64_t k_row, v_row, dk_row, dv_row;
};

template <int QV, bool L1>
void few_queries_backward(const FewQueries& p, int64_t m, int64_t n, int64_t d, float scale, float* scratch) {
  constexpr int mq = QV * W;
  float* weights = scratch;                 // (kRowTile, mq)
  float* grads = weights + kRowTile * mq;   // (kRowTile, mq)
  std::fill(p.dq, p.dq + m * d, 0.0f);      // dQ: summed over all keys in place
  alignas(64) float zero[kRowTile] = {}, qt_sum[mq];
  if constexpr (L1) lane_sums(p.qt, d, mq, qt_sum);
  for (int64_t j = 0; j < n; j += kRowTile) {
    const int64_t count = std::min<int64_t>(kRowTile, n - j);
    prefetch_rows(p.k, p.k_row, j + kRowTile, j + 2 * kRowTile, n, d);  // the next block's rows
    prefetch_rows(p.v, p.v_row, j + kRowTile, j + 2 * kRowTile, n, d);
    prefetch_rows<true>(p.dk, p.dk_row, j + kRowTile, j + 2 * kRowTile, n, d);
    prefetch_rows<true>(p.dv, p.dv_row, j + kRowTile, j + 2 * kRowTile, n, d);
    float* dk = p.dk + j * p.dk_row;
    float* dv = p.dv + j * p.dv_row;
    if (std::all_of(p.bias + j, p.bias + j + count, [](float b) { return b == -INFINITY; })) {
      for (int64_t t = 0; t < count; ++t) std::fill(dk + t * p.dk_row, dk + t * p.dk_row + d, 0.0f),
                                          std::fill(dv + t * p.dv_row, dv + t * p.dv_row + d, 0.0f);
      continue;
    }
    const float* k = p.k + j * p.k_row;
    weights_and_grads_rows<QV, L1>(Scores{k, p.v + j * p.v_row, p.qt, qt_sum, p.dyt, p.bias + j, p.neg_lse, zero, p.delta,
                                          p.k_row, p.v_row}, scale, count, d, weights, grads);
    weighted_rows(weights, mq, p.dy, d, dv, p.dv_row, count, m, d);
    if constexpr (L1) {  // sign(k_j - q_i) = -sign(q_i - k_j): dK_j written, dQ_i accumulated
      sign_contract(grads, mq, k, p.k_row, p.q, dk, p.dk_row, p.dq, count, m, d);
    } else {
      weighted_rows(grads, mq, p.q, d, dk, p.dk_row, count, m, d);
      add_outer<false>(grads, k, p.dq, nullptr, nullptr, nullptr, mq, p.k_row, 0, count, m, d);
    }
  }
}

}  // namespace

extern "C" {
int landmarks_backward_vector_bytes() { return kBytes; }

// Few keys (m <= mp keys, mp = W, 2W, 4W, ... up to kMaxKeys): q, dy, y (batch, heads, n, d) and dq at their
// strides (last stride 1); lse (batch * heads, n); kt, vt (batch * heads, d, mp) the keys and values transposed
// and zero-padded; k (batch * heads, m, d); bias (batch * heads, mp), -inf on padded keys; dk, dv (batch * heads,
// m, d), all contiguous; zero_rows (batch * heads, zero_count) row indices whose dY reads as 0 (rows the
// caller overwrote after the forward; zero_count 0: none). Returns 0, or -1 (nothing written) for an unsupported
// mp, d % W != 0 or a zero row outside [0, n); l1 != 0: L1 distance scores.
int landmarks_few_keys_backward_f32(const float* q, const int64_t* q_strides, const float* dy,
                                    const int64_t* dy_strides, const float* y, const int64_t* y_strides,
                                    const float* lse, const float* kt, const float* vt, const float* k,
                                    const float* bias, float* dq, const int64_t* dq_strides, float* dk, float* dv,
                                    const int64_t* zero_rows, int64_t zero_count, int64_t batch, int64_t heads,
                                    int64_t n, int64_t m, int64_t mp, int64_t d, float scale, int l1,
                                    int threads) {
  if (d % W || m > mp || mp > kMaxKeys || mp % W || !with_vectors(mp / W, [](auto) {})) return -1;
  if (std::any_of(zero_rows, zero_rows + batch * heads * zero_count, [n](int64_t r) { return r < 0 || r >= n; }))
    return -1;
  parallel(batch * heads, threads, [=](int64_t lo, int64_t hi) {
    std::vector<float> scratch(2 * kRowTile * mp + kRowTile * d);
    std::vector<uint8_t> zeroed(n);
    for (int64_t index = lo; index < hi; ++index) {
      const int64_t b = index / heads, h = index % heads;
      const FewKeys p{q + b * q_strides[0] + h * q_strides[1], dy + b * dy_strides[0] + h * dy_strides[1],
                      y + b * y_strides[0] + h * y_strides[1], lse + index * n, kt + index * d * mp,
                      vt + index * d * mp, k + index * m * d, bias + index * mp,
                      dq + b * dq_strides[0] + h * dq_strides[1], dk + index * m * d, dv + index * m * d,
                      q_strides[2], dy_strides[2], y_strides[2], dq_strides[2], zero_rows + index * zero_count,
                      zero_count};
      with_score(l1, [&](auto score) {
        with_vectors(mp / W, [&](auto mv) {
          few_keys_backward<mv(), score()>(p, n, m, d, scale, scratch.data(), zeroed.data());
        });
      });
    }
  });
  return 0;
}

// Few queries (m <= mq queries, mq as mp above): qt, dyt (batch * heads, d, mq) the queries and the output's
// gradient transposed and zero-padded; q, dy (batch * heads, m, d); neg_lse (batch * heads, mq), -lse and -inf on
// padded queries; delta (batch * heads, mq) = dy_i . y_i, 0 on padded queries; dq (batch * heads, m, d), all
// contiguous; k, v, dk, dv (batch, heads, n, d) at their strides (last stride 1); bias (batch, bias_heads, n)
// contiguous, bias_heads 1 or heads; l1 as above. Returns 0, or -1 (nothing written) for an unsupported mq or
// d % W != 0.
int landmarks_few_queries_backward_f32(const float* qt, const float* dyt, const float* q, const float* dy,
                                       const float* neg_lse, const float* delta, const float* k,
                                       const int64_t* k_strides, const float* v, const int64_t* v_strides,
                                       const float* bias, int64_t bias_heads, float* dq, float* dk,
                                       const int64_t* dk_strides, float* dv, const int64_t* dv_strides,
                                       int64_t batch, int64_t heads, int64_t m, int64_t mq, int64_t n, int64_t d,
                                       float scale, int l1, int threads) {
  if (d % W || m > mq || mq > kMaxKeys || mq % W || !with_vectors(mq / W, [](auto) {})) return -1;
  parallel(batch * heads, threads, [=](int64_t lo, int64_t hi) {
    std::vector<float> scratch(2 * kRowTile * mq);
    for (int64_t index = lo; index < hi; ++index) {
      const int64_t b = index / heads, h = index % heads;
      const FewQueries p{qt + index * d * mq, dyt + index * d * mq, q + index * m * d, dy + index * m * d,
                         neg_lse + index * mq, delta + index * mq, k + b * k_strides[0] + h * k_strides[1],
                         v + b * v_strides[0] + h * v_strides[1], bias + (b * bias_heads + h % bias_heads) * n,
                         dq + index * m * d, dk + b * dk_strides[0] + h * dk_strides[1],
                         dv + b * dv_strides[0] + h * dv_strides[1], k_strides[2], v_strides[2], dk_strides[2],
                         dv_strides[2]};
      with_score(l1, [&](auto score) {
        with_vectors(mq / W, [&](auto qv) { few_queries_backward<qv(), score()>(p, m, n, d, scale, scratch.data()); });
      });
    }
  });
  return 0;
}
}
