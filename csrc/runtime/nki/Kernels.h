// Internal interface between the NKI executor's driver (Executor.cpp) and
// its row kernels (Kernels.inc), which are built once per instruction set.
#pragma once

#include <algorithm>
#include <array>
#include <utility>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "Program.h"
#include "csrc/runtime/Philox.h"

namespace neuronrt::nki::detail {

// One launch of a program: buffer base pointers and the engines'
// accumulator registers ([0] Vector Engine, [1] Scalar Engine), one fp32 per
// partition, zeroed at launch.
struct Ctx {
  const Program* program;
  char* const* bufs;
  const int64_t* dtypes;
  uint64_t launch;  // a serial number per launch
  bool aliased;     // bound buffers overlap in memory
  float regs[2][kPartitions];
};

// The HBM rows a thread's next step reads (its next block of partitions, or
// the first block of the next stretch: the next loop iteration), fetched
// into cache while the current step's output streams out. A streamed store
// waits on memory writes; these reads then overlap the writes instead of
// stalling the next step. Executor.cpp plans it per step; the streamed
// stores (Kernels.inc) issue it, `ratio` cache lines per byte they write.
struct Prefetch {
  static constexpr int kMaxRanges = 8;
  struct Range {
    const char* base;  // row r: bytes [base + r * stride, + bytes)
    int64_t stride, bytes;
  };
  Range ranges[kMaxRanges];
  int nranges = 0, range = 0;    // `range` of row `row` is being fetched
  int64_t row = 0, row_end = 0;  // rows left to fetch: [row, row_end)
  const char* next = nullptr;    // its next line (nullptr: nothing left)
  const char* end = nullptr;     // its end
  int64_t scale = 0;             // bytes to fetch per byte streamed, x 2^16
  int64_t credit = 0;            // bytes owed (x 2^16)
  int64_t issued = 0;            // lines fetched since start() (tests)

  void clear() { nranges = 0, next = end = nullptr, credit = 0; }
  // Starts fetching rows [p, pe) of the ranges, `fetch` bytes over `streamed` bytes of stores.
  void start(int64_t p, int64_t pe, int64_t fetch, int64_t streamed) {
    row = p, row_end = pe, range = 0, credit = 0, issued = 0;
    scale = streamed > 0 ? (fetch << 16) / streamed + 1 : 0;
    next = end = nullptr;
    if (nranges > 0 && row < row_end) open();
  }
  // `bytes` more of the step's output were streamed: fetch their share.
  void streamed(int64_t bytes) {
    if (!next) return;
    credit += bytes * scale;
    int64_t lines = credit >> 22;  // whole 64-byte lines owed
    credit -= lines << 22;
    while (lines > 0) {
      const int64_t here = std::min<int64_t>(lines, (end - next + 63) >> 6);
      for (int64_t l = 0; l < here; ++l) __builtin_prefetch(next + l * 64, 0, 3);
      next += here * 64;
      lines -= here;
      issued += here;
      if (next >= end) {
        if (++range == nranges) range = 0, ++row;
        if (row >= row_end) {
          next = nullptr;
          return;
        }
        open();
      }
    }
  }

 private:
  void open() {
    const Range& r = ranges[range];
    const char* first = r.base + row * r.stride;
    next = reinterpret_cast<const char*>(uintptr_t(first) & ~uintptr_t(63));
    end = first + r.bytes;
  }
};

// Per-thread fp32 rows (max_free elements each) and the step's prefetch.
struct Scratch {
  Prefetch prefetch;
  std::vector<float> a, b, c, out;
  void size(int64_t n) {
    if (int64_t(a.size()) < n) {
      a.resize(n);
      b.resize(n);
      c.resize(n);
      out.resize(n);
    }
  }
};

// Runs partitions [lo, hi) of record i; `whole`: one thread runs all of a
// record whose partitions may touch each other's memory.
using RunRecord = void (*)(Ctx& c, int64_t i, int64_t lo, int64_t hi, bool whole, Scratch& sc);

// A partition-local record decoded once per stretch (Executor.cpp): its row
// loop with the operands resolved to addresses and strides, so a block of
// rows costs one indirect call per record instead of run_instr's decoding of
// the record (at one-row blocks that decoding was ~18 % of RMSNorm's samples).
// Records without a row loop of their own decode to one that calls run_instr.
struct RowOp {
  // An element per partition: p's is at base + p * stride (elements); an
  // operand without a base is the immediate `imm`.
  struct Elem {
    char* base = nullptr;
    int64_t stride = 0, dtype = 0;
    float imm = 0.0f;
  };
  // The typed row loops' signature (Kernels.inc stt_typed, gate_mul).
  using Loop = void (*)(const void* a, float s, const void* b, void* d, int64_t n, Prefetch* pf);
  // Runs partitions [lo, hi) of the record (clipped to `rows`).
  using Fn = void (*)(Ctx& c, const RowOp& op, int64_t lo, int64_t hi, Scratch& sc);

  // How a row step runs one partition of the record (Kernels.inc run_rows):
  // the [P, 1] forms and the typed scalar_tensor_tensor inline, so a [P, 1]
  // value can pass to the next record in a register; anything else through
  // `run`.
  enum Step : uint8_t { kCall = 0, kSumSquares, kScalar, kStt };

  Fn run = nullptr;
  Step step = kCall;
  // Its [P, 1] input (x; scalar_tensor_tensor's operand0) is the fp32 element
  // the record before it has just stored for the same partition (plan_stretch).
  bool forward = false;
  int64_t i = 0;     // the record
  const int64_t* w = nullptr;  // its words
  int64_t rows = 0;  // its partitions: [0, rows)
  int64_t n = 0;     // free elements per row
  const char* a = nullptr;  // row 0 of the data, of the second tensor and of dst;
  const char* b = nullptr;  // sa, sb, sd: bytes from one partition's row to the next
  char* d = nullptr;
  int64_t sa = 0, sb = 0, sd = 0;
  Elem x, s0, s1, out;  // [P, 1] forms: data, operands, destination (or reduce_res)
  const View* store = nullptr;  // a row stored through scatter_row (streamed: `stream`)
  bool stream = false;
  Loop loop = nullptr;
  int64_t fn = -1;              // an activation's function
  // its row sum made with it (Kernels.inc act_sum), where the build has one
  bool (*sum)(const void*, float, float, bool, float*, int64_t, float&) = nullptr;
  // (into a bf16 row: d, ed = 2)
  bool (*sum16)(const void*, float, float, bool, float*, uint16_t*, int64_t, float&) = nullptr;
  int64_t ea = 0, eb = 0, ed = 0;  // its rows' element bytes
};
using DecodeRecord = void (*)(const Ctx& c, int64_t i, RowOp& op);
// Partitions [lo, hi) of a row-step stretch's n decoded records, one
// partition at a time (all n records on p, then p + 1).
using RunRows = void (*)(Ctx& c, const RowOp* ops, int64_t n, int64_t lo, int64_t hi, Scratch& sc);

namespace generic {
void run_record(Ctx& c, int64_t i, int64_t lo, int64_t hi, bool whole, Scratch& sc);
void decode_record(const Ctx& c, int64_t i, RowOp& op);
void run_rows(Ctx& c, const RowOp* ops, int64_t n, int64_t lo, int64_t hi, Scratch& sc);
}
namespace avx2 {
void run_record(Ctx& c, int64_t i, int64_t lo, int64_t hi, bool whole, Scratch& sc);
void decode_record(const Ctx& c, int64_t i, RowOp& op);
void run_rows(Ctx& c, const RowOp* ops, int64_t n, int64_t lo, int64_t hi, Scratch& sc);
}
namespace avx512 {
void run_record(Ctx& c, int64_t i, int64_t lo, int64_t hi, bool whole, Scratch& sc);
void decode_record(const Ctx& c, int64_t i, RowOp& op);
void run_rows(Ctx& c, const RowOp* ops, int64_t n, int64_t lo, int64_t hi, Scratch& sc);
}

}  // namespace neuronrt::nki::detail
