// What a vectorised exp would give the native NKI executor (docs/nki.md, "What the
// executor needs"): a standalone measurement, not part of the build. An AVX-512 fp32 exp
// without FMA (built with -ffp-contract=off, as csrc/runtime/nki/Kernels.inc is) against
// glibc's scalar expf, which the executor calls per element today: ns per element over a
// 4 MiB row set, and the worst error in ulp over every float in [-104, 89].
//
//   g++ -O2 -std=c++20 -mavx512f -mavx512dq -ffp-contract=off -fno-math-errno \
//       -fno-trapping-math benchmarks/nki_vexp.cpp -o /tmp/nki_vexp && taskset -c 1 /tmp/nki_vexp
#include <immintrin.h>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

static inline __m512 vexp(__m512 x) {
  const __m512 hi = _mm512_set1_ps(88.7228391f), lo = _mm512_set1_ps(-103.972084f);
  __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  // n = round(x / ln2); r = x - n*ln2 (Cody-Waite, two parts)
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_sub_ps(xc, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  // exp(r) on [-ln2/2, ln2/2]: 1 + r + r^2 * P(r) (Cephes' expf coefficients)
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
  __m512 r2 = _mm512_mul_ps(r, r);
  __m512 y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, r2), r), _mm512_set1_ps(1.0f));
  // y * 2^n in two steps (n can be -150..128: subnormal results and 2^128 overflow to inf)
  __m512i ni = _mm512_cvtps_epi32(n);
  __m512i n1 = _mm512_srai_epi32(ni, 1), n2 = _mm512_sub_epi32(ni, n1);
  __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, _mm512_set1_epi32(127)), 23));
  __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, _mm512_set1_epi32(127)), 23));
  y = _mm512_mul_ps(_mm512_mul_ps(y, s1), s2);
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), y, _mm512_set1_ps(INFINITY));
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), y, _mm512_setzero_ps());
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);  // NaN stays NaN
}

static int64_t ulp(float a, double ref) {
  float r = (float)ref;
  int32_t ia, ir; std::memcpy(&ia, &a, 4); std::memcpy(&ir, &r, 4);
  return std::llabs((int64_t)ia - (int64_t)ir);
}

int main() {
  const int N = 1 << 20;
  std::vector<float> x(N), y(N);
  for (int i = 0; i < N; ++i) x[i] = -20.0f + 40.0f * (float)i / N;
  auto t0 = std::chrono::steady_clock::now();
  for (int rep = 0; rep < 50; ++rep)
    for (int i = 0; i < N; ++i) y[i] = std::exp(x[i]);
  auto t1 = std::chrono::steady_clock::now();
  for (int rep = 0; rep < 50; ++rep)
    for (int i = 0; i < N; i += 16) _mm512_storeu_ps(&y[i], vexp(_mm512_loadu_ps(&x[i])));
  auto t2 = std::chrono::steady_clock::now();
  double s = std::chrono::duration<double>(t1 - t0).count() / (50.0 * N) * 1e9;
  double v = std::chrono::duration<double>(t2 - t1).count() / (50.0 * N) * 1e9;
  // accuracy: every float in [-104, 89]
  int64_t worst = 0, worst_libm = 0; float at = 0; double maxrel = 0;
  float buf[16];
  for (float f = -104.0f; f < 89.0f; f = std::nextafter(f, 100.0f)) {
    __m512 in = _mm512_set1_ps(f);
    _mm512_storeu_ps(buf, vexp(in));
    double ref = std::exp((double)f);
    int64_t u = ulp(buf[0], ref);
    if (u > worst) { worst = u; at = f; }
    if (ref > 1.2e-38 && ref < 3.4e38) maxrel = std::max(maxrel, std::fabs(buf[0] - ref) / ref);
    worst_libm = std::max(worst_libm, ulp(std::exp(f), ref));
  }
  std::printf("scalar expf %.2f ns/elem, vectorised %.2f ns/elem (%.1fx); max ulp vs double exp: vectorised %lld (at %g), glibc expf %lld; max rel (normal results) %.2e\n",
              s, v, s / v, (long long)worst, at, (long long)worst_libm, maxrel);
}
