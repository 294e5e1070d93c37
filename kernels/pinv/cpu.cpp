// CPU kernel of the iterative pseudo-inverse's steps (attention/pinv.py: Nyströmformer, Xiong et al. 2021, eq. 16),
// float32, built and bound by kernels/pinv/cpu.py (plain C ABI through ctypes). Per problem (one m x m matrix A
// and its start Z_0), n_iter steps
//   AZ = A Z,   W = 7I - AZ,   inner = 15I - AZ W,   S = 13/4 I - 1/4 AZ inner,   Z <- Z S,
// and their backward from G = dL/dZ_last: the chain rule of kernels/pinv/ops.py's Iterations, written for the
// transposes so that both operands of every product are read row by row (no transposed operand):
//   dS^T = G^T Z,   dZ^T = S G^T,   dinner^T = -1/4 dS^T AZ,
//   dAZ^T = -1/4 inner dS^T - W dinner^T + dinner^T AZ,   dA^T += Z dAZ^T,   dZ^T += dAZ^T A.
// m = W, 2W, 4W, ... up to kMaxKeys (m x m matrices in cache): R rows of a product stay in registers
// (row_products of landmark_attention.h), one pass over its right operand per R rows. Where ATen runs each of these
// products as its own call (24 per forward, 48 per backward at 6 steps), with a copy of the identity for each
// diagonal term, here a problem's whole iteration is one call. Problems run in parallel.
#include "landmark_attention.h"

namespace {

using namespace landmarks;

constexpr int kStep = 5;  // matrices kept per step for the backward: Z, AZ, W, inner, S (kernels/pinv/cpu.py's STEP_MATRICES)

// c = alpha * a b + beta * c + diag * I for m x m row-major matrices, m = MV * W; c is neither a nor b, and with
// beta = 0 c is only written.
template <int R, int MV>
void product_rows(const float* a, const float* b, float* c, float alpha, float beta, float diag, int64_t i) {
  constexpr int m = MV * W;
  vec acc[R][MV];
  row_products<R, MV>(a + i * m, m, b, m, acc);
  for (int r = 0; r < R; ++r) {
    float* row = c + (i + r) * m;
    for (int u = 0; u < MV; ++u)
      store(row + u * W, beta == 0.0f ? alpha * acc[r][u] : alpha * acc[r][u] + beta * load(row + u * W));
    row[i + r] += diag;
  }
}

template <int MV> void product(const float* a, const float* b, float* c, float alpha, float beta, float diag) {
  constexpr int m = MV * W, R = std::max(1, kAccumulators / MV);
  int64_t i = 0;
  for (; i + R <= m; i += R) product_rows<R, MV>(a, b, c, alpha, beta, diag, i);
  for (; i < m; ++i) product_rows<1, MV>(a, b, c, alpha, beta, diag, i);
}

template <int MV> void transpose(const float* x, float* out) {
  constexpr int m = MV * W;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < m; ++j) out[j * m + i] = x[i * m + j];
}

// The forward steps of one problem: Z_0 = z0, the last Z into out. With saved (n_iter x 5 matrices), each step's
// (Z, AZ, W, inner, S) is kept there for the backward, and each step writes its Z S into the next step's slot;
// otherwise scratch (7 matrices) holds a step's slot (its Z position unused) and two alternating Z.
template <int MV> void iterate(const float* a, const float* z0, float* out, float* saved, int n_iter, float* scratch) {
  constexpr int64_t m = MV * W, mm = m * m;
  float* alternate[2] = {scratch + kStep * mm, scratch + (kStep + 1) * mm};
  if (saved) std::copy(z0, z0 + mm, saved);
  const float* z = saved ? saved : z0;
  for (int t = 0; t < n_iter; ++t) {
    float* slot = saved ? saved + t * kStep * mm : scratch;
    float *az = slot + mm, *w = az + mm, *inner = w + mm, *s = inner + mm;
    float* next = t + 1 == n_iter ? out : saved ? saved + (t + 1) * kStep * mm : alternate[t % 2];
    product<MV>(a, z, az, 1.0f, 0.0f, 0.0f);
    for (int64_t e = 0; e < mm; ++e) w[e] = -az[e];
    for (int64_t i = 0; i < m; ++i) w[i * m + i] += 7.0f;
    product<MV>(az, w, inner, -1.0f, 0.0f, 15.0f);
    product<MV>(az, inner, s, -0.25f, 0.0f, 3.25f);
    product<MV>(z, s, next, 1.0f, 0.0f, 0.0f);
    z = next;
  }
}

// The backward of one problem's steps from grad = dL/dZ_last: dA (grad_a) and dL/dZ_0 (grad_z0); scratch holds 6
// matrices.
template <int MV>
void iterate_backward(const float* a, const float* saved, const float* grad, float* grad_a, float* grad_z0,
                      int n_iter, float* scratch) {
  constexpr int64_t m = MV * W, mm = m * m;
  float *gt = scratch, *gz = gt + mm, *gs = gz + mm, *gi = gs + mm, *ga = gi + mm, *dat = ga + mm;
  transpose<MV>(grad, gt);
  std::fill(dat, dat + mm, 0.0f);
  for (int t = n_iter - 1; t >= 0; --t) {
    const float* slot = saved + t * kStep * mm;
    const float *z = slot, *az = z + mm, *w = az + mm, *inner = w + mm, *s = inner + mm;
    product<MV>(gt, z, gs, 1.0f, 0.0f, 0.0f);       // dS^T = G^T Z
    product<MV>(s, gt, gz, 1.0f, 0.0f, 0.0f);       // dZ^T = S G^T
    product<MV>(gs, az, gi, -0.25f, 0.0f, 0.0f);    // dinner^T = -1/4 dS^T AZ
    product<MV>(inner, gs, ga, -0.25f, 0.0f, 0.0f); // dAZ^T = -1/4 inner dS^T
    product<MV>(w, gi, ga, -1.0f, 1.0f, 0.0f);      //         - W dinner^T
    product<MV>(gi, az, ga, 1.0f, 1.0f, 0.0f);      //         + dinner^T AZ
    product<MV>(z, ga, dat, 1.0f, 1.0f, 0.0f);      // dA^T += Z dAZ^T
    product<MV>(ga, a, gz, 1.0f, 1.0f, 0.0f);       // dZ^T += dAZ^T A
    std::swap(gt, gz);
  }
  transpose<MV>(dat, grad_a);
  transpose<MV>(gt, grad_z0);
}

// Runs f(mv, p, scratch) for every problem p, in parallel, with mv = m / W as a compile-time constant and a scratch
// of `matrices` m x m matrices per thread; false (nothing run) when m is not one of W, 2W, 4W, ... up to kMaxKeys
// or n_iter < 1.
template <typename F> bool each_problem(int64_t problems, int64_t m, int n_iter, int matrices, int threads, F f) {
  if (m % W || m > kMaxKeys || n_iter < 1 || !with_vectors(m / W, [](auto) {})) return false;
  parallel(problems, threads, [=](int64_t lo, int64_t hi) {
    std::vector<float> scratch(matrices * m * m);
    for (int64_t p = lo; p < hi; ++p) with_vectors(m / W, [&](auto mv) { f(mv, p, scratch.data()); });
  });
  return true;
}

}  // namespace

extern "C" {
int pinv_vector_bytes() { return kBytes; }

// problems m x m matrices a and z0 (each problems x m x m, contiguous); out (problems x m x m) the last Z; saved
// (problems x n_iter x 5 x m x m) or null (no backward). Returns 0, or -1 (nothing written) when m is not one of W,
// 2W, 4W, ... up to kMaxKeys or n_iter < 1.
int pinv_iterate_f32(const float* a, const float* z0, float* out, float* saved, int64_t problems, int64_t m,
                     int n_iter, int threads) {
  const int64_t mm = m * m;
  return each_problem(problems, m, n_iter, kStep + 2, threads, [=](auto mv, int64_t p, float* scratch) {
    iterate<mv()>(a + p * mm, z0 + p * mm, out + p * mm, saved ? saved + p * n_iter * kStep * mm : nullptr, n_iter,
                  scratch);
  }) ? 0 : -1;
}

// The backward of pinv_iterate_f32 from grad (problems x m x m, dL/d out): grad_a and grad_z0 (problems x m x m),
// from a and the saved steps of the forward. Returns 0, or -1 (nothing written) as pinv_iterate_f32.
int pinv_iterate_backward_f32(const float* a, const float* saved, const float* grad, float* grad_a, float* grad_z0,
                              int64_t problems, int64_t m, int n_iter, int threads) {
  const int64_t mm = m * m;
  return each_problem(problems, m, n_iter, 6, threads, [=](auto mv, int64_t p, float* scratch) {
    iterate_backward<mv()>(a + p * mm, saved + p * n_iter * kStep * mm, grad + p * mm, grad_a + p * mm,
                           grad_z0 + p * mm, n_iter, scratch);
  }) ? 0 : -1;
}
}
