#include "ShmReduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "shm/ReduceKernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace neuronrt::shm {

namespace detail {

void stream_copy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (n >= 256) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    const size_t body = n & ~size_t{63};
    for (size_t i = 0; i < body; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + body, s + body, n - body);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace detail

namespace {

struct Kernels {
  detail::ReduceFn reduce;
  const char* isa;
};

Kernels pick() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("f16c")) {
    return {detail::avx512::reduce, "avx512"};
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return {detail::avx2::reduce, "avx2"};
#endif
  return {detail::generic::reduce, "generic"};
}

const Kernels& kernels() {
  static const Kernels k = pick();
  return k;
}

}  // namespace

void reduce(ShmDtype dtype, ShmReduceOp op, const void* const* srcs, int n, void* const* dsts, int ndst,
            size_t count, bool stream) {
  kernels().reduce(dtype, op, srcs, n, dsts, ndst, count, stream);
}

const char* reduce_isa() { return kernels().isa; }

void copy_bytes(void* dst, const void* src, size_t n, bool stream) {
  if (stream) {
    detail::stream_copy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

void copy_to_all(void* const* dsts, int ndst, const void* src, size_t n, bool stream) {
  constexpr size_t kBlock = size_t{64} << 10;
  for (size_t a = 0; a < n; a += kBlock) {
    const size_t m = std::min(kBlock, n - a);
    for (int d = 0; d < ndst; ++d) {
      copy_bytes(static_cast<char*>(dsts[d]) + a, static_cast<const char*>(src) + a, m, stream);
    }
  }
}

void store_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace neuronrt::shm
