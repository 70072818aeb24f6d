// Internal interface between the NKI executor's driver (Executor.cpp) and
// its row kernels (Kernels.inc), which are built once per instruction set.
#pragma once

#include <algorithm>
#include <array>
#include <utility>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "Program.h"

namespace neuronrt::nki::detail {

// One launch of a program: buffer base pointers and the engines'
// accumulator registers ([0] Vector Engine, [1] Scalar Engine), one fp32 per
// partition, zeroed at launch.
struct Ctx {
  const Program* program;
  char* const* bufs;
  const int64_t* dtypes;
  float regs[2][kPartitions];
};

// Per-thread fp32 rows (max_free elements each).
struct Scratch {
  std::vector<float> a, b, out;
  void size(int64_t n) {
    if (int64_t(a.size()) < n) {
      a.resize(n);
      b.resize(n);
      out.resize(n);
    }
  }
};

// Runs partitions [lo, hi) of record i; `whole`: one thread runs all of a
// record whose partitions may touch each other's memory.
using RunRecord = void (*)(Ctx& c, int64_t i, int64_t lo, int64_t hi, bool whole, Scratch& sc);

namespace generic {
void run_record(Ctx& c, int64_t i, int64_t lo, int64_t hi, bool whole, Scratch& sc);
}
namespace avx2 {
void run_record(Ctx& c, int64_t i, int64_t lo, int64_t hi, bool whole, Scratch& sc);
}
namespace avx512 {
void run_record(Ctx& c, int64_t i, int64_t lo, int64_t hi, bool whole, Scratch& sc);
}

}  // namespace neuronrt::nki::detail
