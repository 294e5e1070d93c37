// CPU kernel of models/dropout.py's Dropout: y[i] = x[i] * keep[i] / (1 - p) in one pass over n contiguous
// elements, keep[i] decided by a counter-based hash of (seed, i) alone, so the mask does not depend on the
// threads or the chunking, and backward regenerates it from the seed (it is the same call on the gradient).
// Built and bound by kernels/dropout/cpu.py (plain C ABI through ctypes).
//
// Hash: the splitmix64 output function (Steele, Lea, Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014; constants of Vigna's splitmix64.c, mixer "Mix13" of Stafford 2011). key = mix(seed);
// h[i] = mix(key + i * golden): the i-th output of splitmix64 started at key, computed without the i - 1 before it.
// keep[i] = (h[i] >> 32) >= threshold, threshold = round(p * 2^32): P(keep) = 1 - p within 2^-33.
// Dropped elements are x * 0 (as nn.Dropout: NaN and inf stay NaN), kept ones x / (1 - p) exactly (a division
// by 1 - p rounded to the compute type: float for float32 and bfloat16, double for float64).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
constexpr int64_t kBlock = 512;                 // elements whose 0/1 factors are computed before the pass over x
constexpr int64_t kPerThread = int64_t(1) << 16;  // fewer elements than this per thread: fewer threads

inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even, NaN kept quiet (c10::BFloat16's rounding)
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

template <typename T> struct Element {  // storage T, compute type C
  typedef T C;
  static C load(T v) { return v; }
  static T store(C v) { return v; }
};
template <> struct Element<uint16_t> {  // bfloat16 bits
  typedef float C;
  static float load(uint16_t v) { return bf16_to_float(v); }
  static uint16_t store(float v) { return float_to_bf16(v); }
};

template <typename T>
void dropout(const T* x, T* y, int64_t n, uint64_t seed, double p, int threads) {
  typedef typename Element<T>::C C;
  const uint64_t key = mix(seed);
  const uint32_t threshold = uint32_t(std::min(std::llround(p * 4294967296.0), 4294967295LL));
  const C q = C(1.0 - p);
  auto run = [=](int64_t lo, int64_t hi) {
    C factor[kBlock];
    for (int64_t start = lo; start < hi; start += kBlock) {
      const int64_t len = std::min(kBlock, hi - start);
      for (int64_t j = 0; j < len; ++j) {
        const uint64_t h = mix(key + uint64_t(start + j) * kGolden);
        factor[j] = uint32_t(h >> 32) >= threshold ? C(1) : C(0);  // x * 1 / q = x / q exactly
      }
      for (int64_t j = 0; j < len; ++j)
        y[start + j] = Element<T>::store(Element<T>::load(x[start + j]) * factor[j] / q);
    }
  };
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(threads, n / kPerThread));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < parts; ++t) pool.emplace_back(run, n * t / parts, n * (t + 1) / parts);
  run(0, n / parts);
  for (auto& worker : pool) worker.join();
}

}  // namespace

extern "C" {
void dropout_f32(const float* x, float* y, int64_t n, uint64_t seed, double p, int threads) {
  dropout<float>(x, y, n, seed, p, threads);
}
void dropout_f64(const double* x, double* y, int64_t n, uint64_t seed, double p, int threads) {
  dropout<double>(x, y, n, seed, p, threads);
}
void dropout_bf16(const uint16_t* x, uint16_t* y, int64_t n, uint64_t seed, double p, int threads) {
  dropout<uint16_t>(x, y, n, seed, p, threads);
}
}
