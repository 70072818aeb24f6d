// The runtime's GEMV (csrc/runtime/Gemv.h) on cold weights: a decode step of
// SmolLM2-135M (30 layers of q/k/v/o/gate/up/down weights and the tied LM head,
// 211 matmuls, 538 MB of float32), each weight allocated by the runtime's
// device allocator (neuronrt::malloc), so it lies in memory as a model's do:
// large weights in huge-page segments, the k/v projections (442 KB) in its
// medium-block slabs (docs/runtime.md, "Huge pages").
// Every pass runs all 211 weights in order, so each read comes from memory.
// Prints the plain read rate of the same weights (a sum in the same order),
// then per activation-row count (1-4) the step time and GB/s of weight read,
// the same for the 210 layer weights alone, and GB/s per projection. Each figure is the sum of per-matmul minimums over the
// passes, so a preemption on a shared host costs one sample, not the figure.
// A standalone measurement, not part of the build; link the tree's runtime:
//
//   g++ -O2 -std=c++20 -mavx512f -I. benchmarks/gemv_cold.cpp build/cmake/libneuronrt.a -o /tmp/gemv_cold
//   taskset -c 0 /tmp/gemv_cold [passes]
//
// The LM head is one 113 MB call per pass: on a busy host its minimum is the
// noisiest figure (hence the layers' own total).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "csrc/runtime/Gemv.h"
#include "csrc/runtime/Runtime.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

float* alloc_device(size_t bytes) {
  auto* f = static_cast<float*>(neuronrt::malloc(0, bytes));
  for (size_t i = 0; i < bytes / sizeof(float); ++i) f[i] = static_cast<float>(i % 1000) * 1e-3f - 0.5f;
  return f;
}

struct Weight {
  int64_t n, k;
  float* w;
  int kind;  // index into kKinds
};
const char* const kKinds[] = {"q", "k", "v", "o", "gate", "up", "down", "lm"};

volatile float g_sink;

// A plain read of one weight, four 64-byte vectors a step.
void read_weight(const Weight& w) {
  const float* p = w.w;
  const int64_t count = w.n * w.k;
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 64 <= count; i += 64) {
    s0 = _mm512_add_ps(s0, _mm512_loadu_ps(p + i));
    s1 = _mm512_add_ps(s1, _mm512_loadu_ps(p + i + 16));
    s2 = _mm512_add_ps(s2, _mm512_loadu_ps(p + i + 32));
    s3 = _mm512_add_ps(s3, _mm512_loadu_ps(p + i + 48));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
  float sum = 0;
  for (float x : lanes) sum += x;
  g_sink = sum;
}

template <class Fn>
std::vector<double> per_weight_min(const std::vector<Weight>& ws, int passes, Fn fn) {
  std::vector<double> best(ws.size(), 1e9);
  for (int p = 0; p < passes; ++p) {
    double t = now();
    for (size_t i = 0; i < ws.size(); ++i) {
      fn(ws[i]);
      const double e = now();
      best[i] = std::min(best[i], e - t);
      t = e;
    }
  }
  return best;
}

void report(const char* label, const std::vector<Weight>& ws, const std::vector<double>& t) {
  double total = 0, bytes = 0, kind_t[8] = {}, kind_b[8] = {};
  for (size_t i = 0; i < ws.size(); ++i) {
    const double b = static_cast<double>(ws[i].n * ws[i].k) * sizeof(float);
    total += t[i];
    bytes += b;
    kind_t[ws[i].kind] += t[i];
    kind_b[ws[i].kind] += b;
  }
  const double layers_t = total - kind_t[7], layers_b = bytes - kind_b[7];
  std::printf("%-10s %7.2f ms %6.2f GB/s, layers %6.2f ms %5.2f GB/s |", label, total * 1e3, bytes / total / 1e9,
              layers_t * 1e3, layers_b / layers_t / 1e9);
  for (int k = 0; k < 8; ++k) std::printf(" %s %.1f", kKinds[k], kind_b[k] / kind_t[k] / 1e9);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const int passes = argc > 1 ? std::atoi(argv[1]) : 15;
  std::vector<Weight> ws;
  const int64_t shapes[7][2] = {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
  for (int layer = 0; layer < 30; ++layer) {
    for (int s = 0; s < 7; ++s) ws.push_back({shapes[s][0], shapes[s][1], alloc_device(shapes[s][0] * shapes[s][1] * 4), s});
  }
  ws.push_back({49152, 576, alloc_device(49152 * 576 * 4), 7});
  float* a = alloc_device(4 * 1536 * sizeof(float));
  float* out = alloc_device(4 * 49152 * sizeof(float));

  std::printf("SmolLM2-135M decode weights, %d passes, gemv build %s\n", passes, neuronrt::gemv_isa());
  report("plain read", ws, per_weight_min(ws, passes, read_weight));
  for (int64_t rows = 1; rows <= neuronrt::kGemvMaxRows; ++rows) {
    char label[32];
    std::snprintf(label, sizeof label, "gemv %ld", static_cast<long>(rows));
    report(label, ws, per_weight_min(ws, passes, [&](const Weight& w) {
             neuronrt::gemv_f32(rows, 0, w.n, w.k, a, w.k, w.w, w.k, nullptr, 0, out, w.n);
           }));
  }
  return 0;
}
