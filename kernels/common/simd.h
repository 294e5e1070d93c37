// What every CPU kernel (kernels/<method>/cpu.cpp) shares: the vector type of the instruction set kernels/common/build.py compiles
// for, loads and stores, the sign-bit helpers, the thread helper and row prefetching. kernels/common/build.py hashes
// the headers a source includes (one level deep) with the source, so editing this header rebuilds every library.
//
// Vectors are GCC vector extensions, one vector one register (-DLRA_VECTOR_BYTES: 64 with AVX-512, 32 with AVX2,
// 16 otherwise: SSE2, which every x86-64 has, or NEON). A vector wider than the registers is split into several,
// so the kernels' register tiles no longer fit and spill, and GCC lowers comparisons lane by lane (scalar compares
// and branches): width and tiles must follow the -m flags.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#ifndef LRA_VECTOR_BYTES
#define LRA_VECTOR_BYTES 16
#endif

namespace simd {

constexpr int kBytes = LRA_VECTOR_BYTES;
static_assert(kBytes == 16 || kBytes == 32 || kBytes == 64, "LRA_VECTOR_BYTES must be 16, 32 or 64");

template <typename T> struct Lanes;
template <> struct Lanes<float> {
  typedef float vec __attribute__((vector_size(kBytes)));
  typedef int32_t bits __attribute__((vector_size(kBytes)));
  static constexpr int32_t sign = INT32_MIN;
};
template <> struct Lanes<double> {
  typedef double vec __attribute__((vector_size(kBytes)));
  typedef int64_t bits __attribute__((vector_size(kBytes)));
  static constexpr int64_t sign = INT64_MIN;
};
template <typename T> using vec = typename Lanes<T>::vec;
template <typename T> using bits = typename Lanes<T>::bits;
template <typename T> constexpr int W = kBytes / sizeof(T);  // elements per vector

template <typename T> inline vec<T> load(const T* p) {
  vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T> inline void store(T* p, vec<T> v) { std::memcpy(p, &v, sizeof v); }
template <typename T> inline vec<T> splat(T x) { return x - vec<T>{}; }  // folds to a broadcast (x - 0 == x)
// |x|: the sign bit cleared.
template <typename T> inline vec<T> vabs(vec<T> x) { return (vec<T>)((bits<T>)x & ~Lanes<T>::sign); }

// Runs f(lo, hi) over [0, tasks) split into `threads` contiguous ranges (the calling thread takes one).
template <typename F> void parallel(int64_t tasks, int threads, F f) {
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(threads, tasks));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < parts; ++t) pool.emplace_back(f, tasks * t / parts, tasks * (t + 1) / parts);
  f(0, tasks / parts);
  for (auto& worker : pool) worker.join();
}

// Asks for rows [from, min(to, n)) of x (rows x_row elements apart, d elements each) to be brought into cache ahead
// of their use (Write: rows about to be written). Streams with a row stride above a cache line (a head's rows in the
// model's (B, n, H, d) memory) are ones the hardware prefetchers follow late (docs/bench.md, "Landmark kernels on
// CPU").
template <bool Write = false, typename T>
inline void prefetch_rows(const T* x, int64_t x_row, int64_t from, int64_t to, int64_t n, int64_t d) {
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int64_t r = from; r < std::min(to, n); ++r)
    for (int64_t c = 0; c < d; c += kLine) __builtin_prefetch(x + r * x_row + c, Write);
}

}  // namespace simd
