// A lowered NKI program: the table of instruction records that nki/_native.py
// builds from a traced kernel, checked once and ready to execute.
//
// Each record is kRecord int64 words: a kHeader-word header (opcode, flags,
// ALU/activation function, operand slots) and kMaxViews strided views of the
// program's buffers. Buffers are numbered; each is either bound at launch
// (a kernel argument or output in HBM) or placed in the executor's arena
// (SBUF/PSUM tiles, private HBM). The header layout per opcode is documented
// in docs/nki.md ("Native executor") and at its use in Kernels.inc.
//
// Plain C++ (no torch headers): the runtime owns execution.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace neuronrt::nki {

constexpr int kMaxDims = 8;
constexpr int kMaxViews = 5;
constexpr int kHeader = 16;
constexpr int kViewWords = 3 + 2 * kMaxDims;  // buffer, ndim, offset, shape[8], stride[8]
constexpr int kRecord = kHeader + kMaxViews * kViewWords;
constexpr int kPartitions = 128;
constexpr int64_t kStreamBytes = int64_t(8) << 20;

// Element types of buffers. Rows compute in fp32: a load converts to fp32
// and a store converts back (Kernels.inc: to_f32 / from_f32), with torch's
// conversion rules, so the interpreter's `.to(float32)` and `copy_` agree.
enum DType : int64_t {
  F32 = 0, BF16 = 1, F16 = 2, F8E4M3 = 3,  // F8E4M3: torch.float8_e4m3fn (no infinities)
  F8E5M2 = 4, I32 = 5, I16 = 6, I8 = 7, U8 = 8, U16 = 9,
  U32 = 10,   // float -> uint32 as torch on x86 (Kernels.inc f32_to_u32)
  BOOL = 11,  // one byte, 0 or 1; float -> bool is x != 0 (NaN is true)
  kNumDTypes
};

inline int64_t itemsize(int64_t dtype) {
  constexpr int64_t sizes[kNumDTypes] = {4, 2, 2, 1, 1, 4, 2, 1, 1, 2, 4, 1};
  return sizes[dtype];
}
inline bool is_integral(int64_t dtype) { return dtype >= I32; }

enum Opcode : int64_t {
  OP_FILL = 0,  // dst view <- value
  OP_COPY = 1,  // flat row-major copy (dma_copy, tensor_copy, load/store)
  OP_TT = 2,    // tensor_tensor
  OP_TS = 3,    // tensor_scalar
  OP_STT = 4,   // scalar_tensor_tensor (w[8] >= 0: data goes through that activation first)
  OP_ACT = 5,   // activation (+ accumulator registers)
  OP_TRED = 6,  // tensor_reduce over trailing free elements
  OP_NOP = 7,   // (profiling: a record switched off)
  OP_MM = 8,    // nc_matmul: dst[M, N] (+)= stationary[K, M]^T @ moving[K, N] (split: rows of dst)
  OP_SEL = 9,   // dst = cond != 0 ? x : y (x, y: elementwise views or immediates; NaN is true)
  OP_IOTA = 10, // dst[p, i...] = fp32(offset + p * multiplier + sum(i_k * step_k)), in double
  OP_SCAN = 11, // per row: r = op1(op0(data0[i], r), data1[i]), r starts at the initial operand
  OP_REG = 12,  // accumulator registers <- a [P, 1] reduction (reduce_cmd), then (-)registers -> reduce_res
  OP_VAR = 13,  // population variance of each group of w[3] trailing elements (torch's Welford, in double)
  OP_BITS = 14, // bitvector ops on integer rows in int64 (tensor_tensor, tensor_scalar or an and/or reduction)
  OP_PRED = 15, // dst[1, F] = a reduction over the partitions of data[P, F] (w[3] op), one thread
  OP_TOPK = 16, // per row: w[3] 0: the 8 largest of data, descending (max8); 1: the first index of each of vals' 8 in data (-1: none)
  OP_RAND = 17, // Philox uniforms (nki/_philox.py): w[3] 0 rand, 1 nisa.dropout, 2 nl.dropout; w[4] subsequence
  kNumOpcodes
};

// Control records, numbered apart from the instruction opcodes (which grow):
// a device loop (nl.while_loop with a tile condition) is an OP_WHILE record,
// its body's records, and an OP_END record. Each tests the first element of
// its view 0 (nonzero, NaN included, continues: the interpreter's `!= 0` on
// its fp32 value). OP_WHILE (w[3]: its OP_END, w[4]: the iteration cap) tests
// the first condition: zero skips past its OP_END, else iteration 1 begins.
// OP_END (w[3]: its OP_WHILE) tests the condition re-traced after the body:
// nonzero runs the body again. Iteration cap + 1 is an Error with the
// interpreter's message. Both run whole; loops nest.
constexpr int64_t OP_WHILE = 64;
constexpr int64_t OP_END = 65;
inline bool is_control(int64_t opcode) { return opcode == OP_WHILE || opcode == OP_END; }

enum Alu : int64_t {
  A_ADD = 0, A_SUB, A_MUL, A_DIV, A_MAX, A_MIN,
  A_EQ, A_NE, A_GT, A_GE, A_LT, A_LE,
  A_FMOD, A_LAND, A_LOR, A_LXOR,  // fmod is exact; the logical ops give 1.0/0.0 (nonzero, NaN included, is true)
  A_POW,  // libm's powf: within a few ulp of torch's pow (Sleef), docs/nki.md
  kNumAlu
};

// OP_BITS's ops: on int64 values, as torch's CPU kernels (a shift by a
// negative or too large amount gives 0, or the sign for a right shift).
enum BitOp : int64_t { B_AND = 0, B_OR, B_XOR, B_SHL, B_SHR, kNumBitOps };

enum Fn : int64_t {
  // Exact: bit-identical to torch (sqrt: correctly rounded; torch's vectorised sqrt can be 1 ulp off).
  F_COPY = 0, F_SQUARE, F_RELU, F_RSQRT, F_SQRT, F_RECIP, F_ABS, F_NEG, F_CEIL, F_FLOOR, F_TRUNC,
  // Transcendental: within a few ulp of torch (docs/nki.md).
  F_EXP, F_LOG, F_TANH, F_SIGMOID, F_SILU, F_GELU, F_GELU_TANH, F_SOFTPLUS, F_MISH, F_ERF, F_SIN, F_COS, F_TAN,
  F_ARCTAN,
  // Exact: sign (+0 for zeros and NaN, as torch), logical_not (1.0 for zeros).
  F_SIGN, F_LNOT, kNumFn
};

// Header words shared by every record (the rest depend on the opcode).
constexpr int kWholeWord = 13;    // run by one thread over all partitions
constexpr int kBarrierWord = 14;  // all threads synchronise before it
constexpr int kGroupWord = 15;    // starts a new row-interleaved group

// A strided view: element offset, sizes and strides (dim 0 = partitions).
struct View {
  int64_t buf, ndim, offset;
  int64_t shape[kMaxDims];
  int64_t stride[kMaxDims];
  int64_t run;  // free elements per partition when they are one contiguous run, else -1
};

// Where a buffer lives during a launch.
struct Buffer {
  int64_t dtype;
  int64_t numel;
  int64_t arena_offset;  // bytes into the arena; -1: bound at launch
};

class Program {
 public:
  // Checks every record against the buffers (opcodes, functions, operand
  // slots, views inside their buffers, arena placement) and throws
  // neuronrt::Error naming the record on the first violation: a malformed
  // table never reaches the executor.
  Program(std::vector<int64_t> words, std::vector<double> imms, std::vector<Buffer> buffers,
          int64_t arena_bytes, std::string name);

  const std::string& name() const { return name_; }
  int64_t size() const { return ninstr_; }
  const int64_t* record(int64_t i) const { return words_.data() + i * kRecord; }
  const double* imms(int64_t i) const { return imms_.data() + i * 2; }
  const View& view(int64_t i, int64_t slot) const { return views_[i * kMaxViews + slot]; }
  const std::vector<Buffer>& buffers() const { return buffers_; }
  const int64_t* dtypes() const { return dtypes_.data(); }
  // Rows stored into this buffer use streaming stores: a bound (HBM) buffer
  // of at least kStreamBytes, which the caches could not hold anyway.
  bool streamed(int64_t buf) const { return streamed_[buf]; }
  // Whether a record writes this buffer (its destination, or an activation's
  // reduce_res): a bound buffer that none writes is the same for a whole launch.
  bool written(int64_t buf) const { return written_[buf]; }
  // Buffer ids bound at launch, in increasing order.
  const std::vector<int64_t>& bound() const { return bound_; }
  int64_t arena_bytes() const { return arena_bytes_; }
  // The widest free size of any operand: the per-thread scratch row.
  int64_t max_free() const { return max_free_; }
  // Whether the table has device loops (OP_WHILE / OP_END).
  bool has_loops() const { return has_loops_; }

 private:
  void check_record(int64_t i) const;
  void check_control(int64_t i) const;

  std::vector<int64_t> words_;
  std::vector<double> imms_;
  std::vector<Buffer> buffers_;
  std::vector<View> views_;
  std::vector<int64_t> dtypes_;  // per buffer
  std::vector<bool> streamed_;   // per buffer
  std::vector<bool> written_;    // per buffer
  std::vector<int64_t> bound_;
  int64_t ninstr_ = 0;
  int64_t arena_bytes_ = 0;
  int64_t max_free_ = 1;
  bool has_loops_ = false;
  std::string name_;
};

}  // namespace neuronrt::nki
