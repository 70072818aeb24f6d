// Native executor for traced NKI programs (see nki/_native.py).
//
// One C function runs a whole lowered program: every instruction is a loop
// over partitions, each partition row processed as a flat fp32 vector (the
// engines' internal precision) with auto-vectorised inner loops, then
// rounded on store. Results are bit-identical to nki/_exec.py: the same fp32
// operations in the same order, bf16 rounding to nearest even, and sums in
// the order of torch's CPU cascade sum (aten/src/ATen/native/cpu/SumKernel.cpp),
// which the interpreter uses.
//
// Plain C++ (no torch headers): compiled once through Inductor's C++
// toolchain and cached by source hash.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

namespace {

constexpr int kMaxDims = 8;
constexpr int kLanes = NKI_SUM_LANES;  // torch's Vectorized<float>::size() on this CPU

enum DType : int64_t { F32 = 0, BF16 = 1 };

enum Opcode : int64_t {
  OP_FILL = 0,   // dst view <- value
  OP_COPY = 1,   // flat row-major copy (dma_copy, tensor_copy, load/store)
  OP_TT = 2,     // tensor_tensor
  OP_TS = 3,     // tensor_scalar
  OP_STT = 4,    // scalar_tensor_tensor
  OP_ACT = 5,    // activation (+ accumulator registers)
  OP_TRED = 6,   // tensor_reduce over trailing free elements
  OP_NOP = 7,    // (profiling: a record switched off)
};

enum Alu : int64_t {
  A_ADD = 0, A_SUB, A_MUL, A_DIV, A_MAX, A_MIN,
  A_EQ, A_NE, A_GT, A_GE, A_LT, A_LE,
};

enum Fn : int64_t {
  F_COPY = 0, F_SQUARE, F_RELU, F_RSQRT, F_SQRT, F_RECIP, F_ABS, F_NEG,
};

// A strided view: element offset, sizes and strides (dim 0 = partitions).
struct View {
  int64_t buf, ndim, offset;
  int64_t shape[kMaxDims];
  int64_t stride[kMaxDims];
  int64_t run;  // free elements per partition when they are one contiguous run, else -1
};

// Program layout (int64 words): per instruction a fixed record.
constexpr int kViewWords = 3 + 2 * kMaxDims;
constexpr int kMaxViews = 5;
constexpr int kHeader = 16;
constexpr int kRecord = kHeader + kMaxViews * kViewWords;

struct Ctx {
  char** bufs;       // base pointer per buffer
  const int64_t* dtypes;
  const int64_t* prog;
  std::vector<View> views;  // parsed views, kMaxViews per record
  float regs[2][128];  // accumulator registers: [0] vector engine, [1] scalar engine
};

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  // c10::BFloat16's round to nearest even; NaN -> canonical quiet NaN.
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (f != f) return 0x7FC0;
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

View read_view(const int64_t* w) {
  View v;
  v.buf = w[0];
  v.ndim = w[1];
  v.offset = w[2];
  for (int i = 0; i < kMaxDims; ++i) {
    v.shape[i] = w[3 + i];
    v.stride[i] = w[3 + kMaxDims + i];
  }
  // Free dims that coalesce into one stride-1 run (the common tile layout).
  int64_t expect = 1, n = 1;
  bool run = true;
  for (int i = int(v.ndim) - 1; i >= 1; --i) {
    if (v.shape[i] == 1) continue;
    if (v.stride[i] != expect) run = false;
    expect *= v.shape[i];
    n *= v.shape[i];
  }
  v.run = run ? n : -1;
  return v;
}

inline const View& V(const Ctx& c, const int64_t* w, int64_t slot) {
  return c.views[((w - c.prog) / kRecord) * kMaxViews + slot];
}

// Iterates a (sub)view in row-major order as runs along its innermost dim.
struct Cursor {
  int64_t ndim;
  int64_t shape[kMaxDims], stride[kMaxDims], idx[kMaxDims];
  int64_t pos;       // element offset of the current run start + done
  int64_t run_left;  // elements left in the current run
  int64_t base;
  bool done;

  // dims [first, ndim) of v, with the partition index `p` fixed when first == 1.
  Cursor(const View& v, int first, int64_t p) {
    base = v.offset + (first == 1 ? p * v.stride[0] : 0);
    ndim = 0;
    for (int i = first; i < v.ndim; ++i) {
      if (v.shape[i] == 1) continue;
      // Coalesce with the previous dim when contiguous with it.
      if (ndim > 0 && stride[ndim - 1] == v.stride[i] * v.shape[i]) {
        shape[ndim - 1] *= v.shape[i];
        stride[ndim - 1] = v.stride[i];
      } else {
        shape[ndim] = v.shape[i];
        stride[ndim] = v.stride[i];
        ++ndim;
      }
    }
    if (ndim == 0) {
      shape[0] = 1;
      stride[0] = 1;
      ndim = 1;
    }
    for (int i = 0; i < ndim; ++i) idx[i] = 0;
    done = false;
    pos = base;
    run_left = shape[ndim - 1];
  }
  int64_t inner_stride() const { return stride[ndim - 1]; }
  // Advances by n elements (n <= run_left).
  void advance(int64_t n) {
    run_left -= n;
    pos += n * stride[ndim - 1];
    if (run_left > 0) return;
    idx[ndim - 1] = 0;
    int d = int(ndim) - 2;
    for (; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
    if (d < 0) {
      done = true;
      return;
    }
    pos = base;
    for (int i = 0; i < ndim - 1; ++i) pos += idx[i] * stride[i];
    run_left = shape[ndim - 1];
  }
};

// fp32 values of the flat free elements of partition p, in row-major order.
void gather_row(const Ctx& c, const View& v, int64_t p, float* out) {
  const bool bf = c.dtypes[v.buf] == BF16;
  char* base = c.bufs[v.buf];
  if (v.run >= 0) {
    const int64_t off = v.offset + p * v.stride[0];
    if (bf) {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(base) + off;
      for (int64_t i = 0; i < v.run; ++i) out[i] = bf16_to_f32(src[i]);
    } else {
      std::memcpy(out, reinterpret_cast<const float*>(base) + off, v.run * 4);
    }
    return;
  }
  Cursor cur(v, 1, p);
  int64_t k = 0;
  while (!cur.done) {
    const int64_t n = cur.run_left, s = cur.inner_stride();
    if (bf) {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(base) + cur.pos;
      if (s == 1)
        for (int64_t i = 0; i < n; ++i) out[k + i] = bf16_to_f32(src[i]);
      else if (s == 2)
        for (int64_t i = 0; i < n; ++i) out[k + i] = bf16_to_f32(src[i * 2]);
      else
        for (int64_t i = 0; i < n; ++i) out[k + i] = bf16_to_f32(src[i * s]);
    } else {
      const float* src = reinterpret_cast<const float*>(base) + cur.pos;
      if (s == 1)
        std::memcpy(out + k, src, n * 4);
      else if (s == 2)  // a constant stride lets the compiler vectorise (pooling windows)
        for (int64_t i = 0; i < n; ++i) out[k + i] = src[i * 2];
      else
        for (int64_t i = 0; i < n; ++i) out[k + i] = src[i * s];
    }
    k += n;
    cur.advance(n);
  }
}

// Stores fp32 values into partition p of v, rounding to its dtype.
void scatter_row(const Ctx& c, const View& v, int64_t p, const float* in) {
  const bool bf = c.dtypes[v.buf] == BF16;
  char* base = c.bufs[v.buf];
  if (v.run >= 0) {
    const int64_t off = v.offset + p * v.stride[0];
    if (bf) {
      uint16_t* dst = reinterpret_cast<uint16_t*>(base) + off;
      for (int64_t i = 0; i < v.run; ++i) dst[i] = f32_to_bf16(in[i]);
    } else {
      std::memmove(reinterpret_cast<float*>(base) + off, in, v.run * 4);
    }
    return;
  }
  Cursor cur(v, 1, p);
  int64_t k = 0;
  while (!cur.done) {
    const int64_t n = cur.run_left, s = cur.inner_stride();
    if (bf) {
      uint16_t* dst = reinterpret_cast<uint16_t*>(base) + cur.pos;
      if (s == 1)
        for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(in[k + i]);
      else
        for (int64_t i = 0; i < n; ++i) dst[i * s] = f32_to_bf16(in[k + i]);
    } else {
      float* dst = reinterpret_cast<float*>(base) + cur.pos;
      if (s == 1)
        std::memmove(dst, in + k, n * 4);
      else
        for (int64_t i = 0; i < n; ++i) dst[i * s] = in[k + i];
    }
    k += n;
    cur.advance(n);
  }
}

// A row of an fp32 view whose free dims are one contiguous run: no copy.
float* direct_row(const Ctx& c, const View& v, int64_t p, int64_t free) {
  if (c.dtypes[v.buf] != F32 || v.run != free) return nullptr;
  return reinterpret_cast<float*>(c.bufs[v.buf]) + v.offset + p * v.stride[0];
}

inline float nan_of(float a, float b) { return a + b; }  // propagates the NaN operand

void alu(int64_t op, const float* a, const float* b, float bs, bool bscalar, bool reverse, float* out, int64_t n) {
  // out = op(a, b) (or op(b, a) when reverse); b is a vector or the scalar bs.
#define NKI_LOOP(EXPR)                                              \
  if (bscalar) {                                                    \
    if (!reverse) for (int64_t i = 0; i < n; ++i) { float x = a[i], y = bs; out[i] = (EXPR); } \
    else for (int64_t i = 0; i < n; ++i) { float y = a[i], x = bs; out[i] = (EXPR); }         \
  } else {                                                          \
    if (!reverse) for (int64_t i = 0; i < n; ++i) { float x = a[i], y = b[i]; out[i] = (EXPR); } \
    else for (int64_t i = 0; i < n; ++i) { float y = a[i], x = b[i]; out[i] = (EXPR); }         \
  }                                                                 \
  break;
  switch (op) {
    case A_ADD: NKI_LOOP(x + y)
    case A_SUB: NKI_LOOP(x - y)
    case A_MUL: NKI_LOOP(x * y)
    case A_DIV: NKI_LOOP(x / y)
    case A_MAX: NKI_LOOP((x != x || y != y) ? nan_of(x, y) : (x > y ? x : y))
    case A_MIN: NKI_LOOP((x != x || y != y) ? nan_of(x, y) : (x < y ? x : y))
    case A_EQ: NKI_LOOP(x == y ? 1.0f : 0.0f)
    case A_NE: NKI_LOOP(x != y ? 1.0f : 0.0f)
    case A_GT: NKI_LOOP(x > y ? 1.0f : 0.0f)
    case A_GE: NKI_LOOP(x >= y ? 1.0f : 0.0f)
    case A_LT: NKI_LOOP(x < y ? 1.0f : 0.0f)
    case A_LE: NKI_LOOP(x <= y ? 1.0f : 0.0f)
  }
#undef NKI_LOOP
}

template <int OP>
inline float apply(float x, float y) {
  if constexpr (OP == A_ADD) return x + y;
  else if constexpr (OP == A_SUB) return x - y;
  else if constexpr (OP == A_MUL) return x * y;
  else if constexpr (OP == A_MAX) return (x != x || y != y) ? nan_of(x, y) : (x > y ? x : y);
  else return (x != x || y != y) ? nan_of(x, y) : (x < y ? x : y);
}

// scalar_tensor_tensor in one pass: out = op1(op0(a, s), b).
template <int O0, int O1>
void stt_fused(const float* a, float s, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = apply<O1>(apply<O0>(a[i], s), b[i]);
}

template <int FN>
inline float activate(float x) {
  if constexpr (FN == F_COPY) return x;
  else if constexpr (FN == F_SQUARE) return x * x;
  else if constexpr (FN == F_RELU) return x != x ? x : (x > 0.0f ? x : 0.0f);
  else if constexpr (FN == F_RSQRT) return 1.0f / std::sqrt(x);
  else if constexpr (FN == F_SQRT) return std::sqrt(x);
  else if constexpr (FN == F_RECIP) return 1.0f / x;
  else if constexpr (FN == F_ABS) return std::fabs(x);
  else return -x;
}

// activation in one pass: out = fn(a * scale + bias) (the same fp32 steps).
template <int FN>
void act_fused(const float* a, float scale, float bias, bool has_bias, float* out, int64_t n) {
  if (has_bias)
    for (int64_t i = 0; i < n; ++i) out[i] = activate<FN>(a[i] * scale + bias);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = activate<FN>(a[i] * scale);
}

// One element: the same expressions as alu() and activate<>().
float alu1(int64_t op, float x, float y) {
  switch (op) {
    case A_ADD: return x + y;
    case A_SUB: return x - y;
    case A_MUL: return x * y;
    case A_DIV: return x / y;
    case A_MAX: return (x != x || y != y) ? nan_of(x, y) : (x > y ? x : y);
    case A_MIN: return (x != x || y != y) ? nan_of(x, y) : (x < y ? x : y);
    case A_EQ: return x == y ? 1.0f : 0.0f;
    case A_NE: return x != y ? 1.0f : 0.0f;
    case A_GT: return x > y ? 1.0f : 0.0f;
    case A_GE: return x >= y ? 1.0f : 0.0f;
    case A_LT: return x < y ? 1.0f : 0.0f;
    default: return x <= y ? 1.0f : 0.0f;
  }
}

float act1(int64_t fn, float x) {
  switch (fn) {
    case F_COPY: return activate<F_COPY>(x);
    case F_SQUARE: return activate<F_SQUARE>(x);
    case F_RELU: return activate<F_RELU>(x);
    case F_RSQRT: return activate<F_RSQRT>(x);
    case F_SQRT: return activate<F_SQRT>(x);
    case F_RECIP: return activate<F_RECIP>(x);
    case F_ABS: return activate<F_ABS>(x);
    default: return activate<F_NEG>(x);
  }
}

using ActFn = void (*)(const float*, float, float, bool, float*, int64_t);
constexpr ActFn act_table[8] = {act_fused<F_COPY>, act_fused<F_SQUARE>, act_fused<F_RELU>, act_fused<F_RSQRT>,
                                act_fused<F_SQRT>, act_fused<F_RECIP>, act_fused<F_ABS>, act_fused<F_NEG>};

inline float load_f32(float v) { return v; }
inline float load_f32(uint16_t v) { return bf16_to_f32(v); }
inline void store_f32(float* d, float v) { *d = v; }
inline void store_f32(uint16_t* d, float v) { *d = f32_to_bf16(v); }

// scalar_tensor_tensor straight from fp32/bf16 rows into an fp32/bf16 row:
// no gather into scratch, no separate rounding pass.
template <int O0, int O1, class Ta, class Tb, class Td>
void stt_typed(const void* a, float s, const void* b, void* d, int64_t n) {
  const Ta* x = static_cast<const Ta*>(a);
  const Tb* y = static_cast<const Tb*>(b);
  Td* o = static_cast<Td*>(d);
  for (int64_t i = 0; i < n; ++i) store_f32(o + i, apply<O1>(apply<O0>(load_f32(x[i]), s), load_f32(y[i])));
}

using SttTyped = void (*)(const void*, float, const void*, void*, int64_t);
template <int O0, int O1>
SttTyped stt_pick(int ta, int tb, int td) {
  switch (ta * 4 + tb * 2 + td) {
    case 0: return stt_typed<O0, O1, float, float, float>;
    case 1: return stt_typed<O0, O1, float, float, uint16_t>;
    case 2: return stt_typed<O0, O1, float, uint16_t, float>;
    case 3: return stt_typed<O0, O1, float, uint16_t, uint16_t>;
    case 4: return stt_typed<O0, O1, uint16_t, float, float>;
    case 5: return stt_typed<O0, O1, uint16_t, float, uint16_t>;
    case 6: return stt_typed<O0, O1, uint16_t, uint16_t, float>;
    default: return stt_typed<O0, O1, uint16_t, uint16_t, uint16_t>;
  }
}

using SttFn = void (*)(const float*, float, const float*, float*, int64_t);
template <int O0>
constexpr SttFn stt_row[5] = {stt_fused<O0, A_ADD>, stt_fused<O0, A_SUB>, stt_fused<O0, A_MUL>,
                              stt_fused<O0, A_MAX>, stt_fused<O0, A_MIN>};
constexpr const SttFn* stt_table[5] = {stt_row<A_ADD>, stt_row<A_SUB>, stt_row<A_MUL>, stt_row<A_MAX>,
                                       stt_row<A_MIN>};

int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  return 64 - __builtin_clzll(uint64_t(x - 1));
}

// torch's cascade sum of a contiguous fp32 row (row_sum / multi_row_sum with
// L-lane accumulators: L = Vectorized<float>::size() when n >= L, else 1).
struct Identity {
  float operator()(float v) const { return v; }
};
struct Square {  // the sum of an activation's squares without storing them
  float operator()(float v) const { return v * v; }
};

struct SquareBf16 {  // the same on a bf16 row read in place
  float operator()(uint16_t v) const {
    const float x = bf16_to_f32(v);
    return x * x;
  }
};

template <int L, class Fn = Identity, class T = float>
float cascade_sum(const T* x, int64_t n, Fn f = Fn()) {
  const int64_t nv = n / L;           // L-wide loads
  const int64_t size = nv / 4;        // rows of the ilp-4 view
  constexpr int kLevels = 4;
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(size) / kLevels);
  const int64_t level_step = int64_t(1) << level_power;
  const int64_t level_mask = level_step - 1;
  float acc[kLevels][4][L];
  for (int j = 0; j < kLevels; ++j)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < L; ++l) acc[j][k][l] = 0.0f;
  int64_t i = 0;
  for (; i + level_step <= size;) {
    for (int64_t j = 0; j < level_step; ++j, ++i)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < L; ++l) acc[0][k][l] += f(x[(i * 4 + k) * L + l]);
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < L; ++l) {
          acc[j][k][l] += acc[j - 1][k][l];
          acc[j - 1][k][l] = 0.0f;
        }
      const int64_t mask = level_mask << (j * level_power);
      if ((i & mask) != 0) break;
    }
  }
  for (; i < size; ++i)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < L; ++l) acc[0][k][l] += f(x[(i * 4 + k) * L + l]);
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < L; ++l) acc[0][k][l] += acc[j][k][l];
  // row_sum: the loads left over by the ilp-4 view, then the 4 partials.
  for (int64_t v = size * 4; v < nv; ++v)
    for (int l = 0; l < L; ++l) acc[0][0][l] += f(x[v * L + l]);
  for (int k = 1; k < 4; ++k)
    for (int l = 0; l < L; ++l) acc[0][0][l] += acc[0][k][l];
  if (L == 1) return 0.0f + acc[0][0][0];  // stored by accumulating into a zeroed output
  float total = 0.0f;
  for (int64_t k = nv * L; k < n; ++k) total += f(x[k]);
  for (int l = 0; l < L; ++l) total += acc[0][0][l];
  return 0.0f + total;
}

// cascade_sum<8> with the accumulators in vector registers (GCC vector
// extensions: lane-wise IEEE adds, the same arithmetic as torch's Vectorized).
typedef float v8f __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, 32);
  return v;
}
inline v8f load8(const uint16_t* p) {
  v8h h;
  std::memcpy(&h, p, 16);
  v8u u = __builtin_convertvector(h, v8u) << 16;
  v8f v;
  std::memcpy(&v, &u, 32);
  return v;
}
struct VIdentity {
  v8f operator()(v8f v) const { return v; }
};
struct VSquare {
  v8f operator()(v8f v) const { return v * v; }
};

template <class VFn, class Fn, class T>
float cascade_sum8(const T* x, int64_t n, VFn vf, Fn f) {
  constexpr int L = 8;
  const int64_t nv = n / L;
  const int64_t size = nv / 4;
  constexpr int kLevels = 4;
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(size) / kLevels);
  const int64_t level_step = int64_t(1) << level_power;
  const int64_t level_mask = level_step - 1;
  const v8f zero = {0, 0, 0, 0, 0, 0, 0, 0};
  v8f acc[kLevels][4];
  for (int j = 0; j < kLevels; ++j)
    for (int k = 0; k < 4; ++k) acc[j][k] = zero;
  int64_t i = 0;
  for (; i + level_step <= size;) {
    v8f a0 = acc[0][0], a1 = acc[0][1], a2 = acc[0][2], a3 = acc[0][3];
    for (int64_t j = 0; j < level_step; ++j, ++i) {
      const T* q = x + i * 4 * L;
      a0 += vf(load8(q));
      a1 += vf(load8(q + L));
      a2 += vf(load8(q + 2 * L));
      a3 += vf(load8(q + 3 * L));
    }
    acc[0][0] = a0, acc[0][1] = a1, acc[0][2] = a2, acc[0][3] = a3;
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < 4; ++k) {
        acc[j][k] += acc[j - 1][k];
        acc[j - 1][k] = zero;
      }
      const int64_t mask = level_mask << (j * level_power);
      if ((i & mask) != 0) break;
    }
  }
  for (; i < size; ++i)
    for (int k = 0; k < 4; ++k) acc[0][k] += vf(load8(x + (i * 4 + k) * L));
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < 4; ++k) acc[0][k] += acc[j][k];
  for (int64_t v = size * 4; v < nv; ++v) acc[0][0] += vf(load8(x + v * L));
  for (int k = 1; k < 4; ++k) acc[0][0] += acc[0][k];
  float total = 0.0f;
  for (int64_t k = nv * L; k < n; ++k) total += f(x[k]);
  for (int l = 0; l < L; ++l) total += acc[0][0][l];
  return 0.0f + total;
}

template <class VFn, class Fn, class T>
float lane_sum(const T* x, int64_t n, VFn vf, Fn f) {
  // torch's vectorised sum for rows of at least one vector, its scalar one below.
  if (n < kLanes) return cascade_sum<1>(x, n, f);
  if constexpr (kLanes == 8) return cascade_sum8(x, n, vf, f);
  return cascade_sum<kLanes>(x, n, f);
}

float reduce_row(int64_t op, const float* x, int64_t n) {
  if (op == A_ADD) return lane_sum(x, n, VIdentity(), Identity());
  float r = x[0];
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    if (v != v) nan = true;
    r = op == A_MAX ? (v > r ? v : r) : (v < r ? v : r);
  }
  if (nan)
    for (int64_t i = 0; i < n; ++i)
      if (x[i] != x[i]) return x[i];
  return r;
}

float combine(int64_t op, float a, float b) {
  // torch.stack([a, b]) reduced over dim 0 (the interpreter's register fold).
  if (op == A_ADD) return 0.0f + ((0.0f + a) + b);
  if (a != a) return a;
  if (b != b) return b;
  return op == A_MAX ? std::max(a, b) : std::min(a, b);
}

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

int64_t free_numel(const View& v) {
  int64_t n = 1;
  for (int i = 1; i < v.ndim; ++i) n *= v.shape[i];
  return n;
}

int64_t view_numel(const View& v) {
  int64_t n = 1;
  for (int i = 0; i < v.ndim; ++i) n *= v.shape[i];
  return n;
}

// A per-partition operand: an immediate or a [P, 1] tile.
float operand_at(const Ctx& c, const int64_t* w, int slot, double imm, int64_t p) {
  if (w[slot] < 0) return float(imm);
  const View& v = V(c, w, w[slot]);
  const int64_t off = v.offset + (v.shape[0] == 1 ? 0 : p * v.stride[0]);  // [1, 1] broadcasts
  if (c.dtypes[v.buf] == BF16) return bf16_to_f32(reinterpret_cast<const uint16_t*>(c.bufs[v.buf])[off]);
  return reinterpret_cast<const float*>(c.bufs[v.buf])[off];
}

void fill_cursor(const Ctx& c, int64_t buf, Cursor cur, double value) {
  const bool bf = c.dtypes[buf] == BF16;
  const float f = float(value);
  const uint16_t h = f32_to_bf16(f);
  while (!cur.done) {
    const int64_t n = cur.run_left, s = cur.inner_stride();
    if (bf) {
      uint16_t* d = reinterpret_cast<uint16_t*>(c.bufs[buf]) + cur.pos;
      for (int64_t i = 0; i < n; ++i) d[i * s] = h;
    } else {
      float* d = reinterpret_cast<float*>(c.bufs[buf]) + cur.pos;
      for (int64_t i = 0; i < n; ++i) d[i * s] = f;
    }
    cur.advance(n);
  }
}

// Element-by-element copy of two cursors' runs, converting through fp32 when
// the dtypes differ.
void copy_cursors(const Ctx& c, int64_t dbuf, char* dbase, Cursor a, int64_t sbuf, char* sbase, Cursor b) {
  const bool sbf = c.dtypes[sbuf] == BF16, dbf = c.dtypes[dbuf] == BF16;
  const int64_t esize = dbf ? 2 : 4;
  while (!a.done && !b.done) {
    const int64_t n = std::min(a.run_left, b.run_left);
    const int64_t ds = a.inner_stride(), ss = b.inner_stride();
    if (sbf == dbf) {
      if (ds == 1 && ss == 1) {
        std::memmove(dbase + a.pos * esize, sbase + b.pos * esize, n * esize);
      } else if (esize == 4) {
        float* d = reinterpret_cast<float*>(dbase) + a.pos;
        const float* s = reinterpret_cast<const float*>(sbase) + b.pos;
        for (int64_t i = 0; i < n; ++i) d[i * ds] = s[i * ss];
      } else {
        uint16_t* d = reinterpret_cast<uint16_t*>(dbase) + a.pos;
        const uint16_t* s = reinterpret_cast<const uint16_t*>(sbase) + b.pos;
        for (int64_t i = 0; i < n; ++i) d[i * ds] = s[i * ss];
      }
    } else if (sbf) {
      float* d = reinterpret_cast<float*>(dbase) + a.pos;
      const uint16_t* s = reinterpret_cast<const uint16_t*>(sbase) + b.pos;
      for (int64_t i = 0; i < n; ++i) d[i * ds] = bf16_to_f32(s[i * ss]);
    } else {
      uint16_t* d = reinterpret_cast<uint16_t*>(dbase) + a.pos;
      const float* s = reinterpret_cast<const float*>(sbase) + b.pos;
      for (int64_t i = 0; i < n; ++i) d[i * ds] = f32_to_bf16(s[i * ss]);
    }
    a.advance(n);
    b.advance(n);
  }
}

void run_copy_whole(const Ctx& c, const View& dst, const View& src) {
  // Flat row-major copy; a source sharing the destination's buffer is read
  // completely first (the interpreter's copy_ from a clone).
  const int64_t total = view_numel(dst);
  char* sbase = c.bufs[src.buf];
  Cursor b(src, 0, 0);
  std::vector<char> tmp;
  if (dst.buf == src.buf) {
    const int64_t ssize = c.dtypes[src.buf] == BF16 ? 2 : 4;
    tmp.resize(total * ssize);
    int64_t k = 0;
    while (!b.done) {
      const int64_t n = b.run_left, s = b.inner_stride();
      for (int64_t i = 0; i < n; ++i) std::memcpy(&tmp[(k + i) * ssize], sbase + (b.pos + i * s) * ssize, ssize);
      k += n;
      b.advance(n);
    }
    View flat{};
    flat.buf = src.buf;
    flat.ndim = 1;
    flat.shape[0] = total;
    flat.stride[0] = 1;
    b = Cursor(flat, 0, 0);
    sbase = tmp.data();
  }
  copy_cursors(c, dst.buf, c.bufs[dst.buf], Cursor(dst, 0, 0), src.buf, sbase, b);
}

// One partition row of an elementwise instruction (TT, TS, STT, ACT) or
// TRED into `out`; returns the row's sum for ACT's registers.
float compute_row(const Ctx& c, const int64_t* w, const double* imm, const View& data, int64_t p, int64_t n,
                  float* out, Scratch& sc, bool store) {
  const int64_t opcode = w[0];
  if (opcode == OP_ACT && !store && (w[7] == 2 || w[7] == 3) && w[3] == F_SQUARE && w[5] < 0 && imm[0] == 1.0 &&
      w[6] == -2 && c.dtypes[data.buf] == BF16 && data.run == n) {
    // Dead destination of a bf16 tile: the sum of squares, read in place.
    const uint16_t* x = reinterpret_cast<const uint16_t*>(c.bufs[data.buf]) + data.offset + p * data.stride[0];
    return lane_sum(x, n, VSquare(), SquareBf16());
  }
  const float* a = direct_row(c, data, p, n);
  if (!a) {
    gather_row(c, data, p, sc.a.data());
    a = sc.a.data();
  }
  float red = 0.0f;
  switch (opcode) {
    case OP_TT: {
      const View& b = V(c, w, 2);
      const float* bp = direct_row(c, b, p, n);
      if (!bp) {
        gather_row(c, b, p, sc.b.data());
        bp = sc.b.data();
      }
      alu(w[3], a, bp, 0.0f, false, false, out, n);
      break;
    }
    case OP_TS:
      alu(w[3], a, nullptr, operand_at(c, w, 5, imm[0], p), true, w[4] != 0, out, n);
      if (w[6] >= 0) alu(w[6], out, nullptr, operand_at(c, w, 8, imm[1], p), true, w[7] != 0, out, n);
      break;
    case OP_STT: {
      const View& b = V(c, w, 2);
      const float* bp = direct_row(c, b, p, n);
      if (!bp) {
        gather_row(c, b, p, sc.b.data());
        bp = sc.b.data();
      }
      const float s0 = operand_at(c, w, 5, imm[0], p);
      if (w[4] == 0 && w[7] == 0 && w[3] <= A_MIN && w[6] <= A_MIN && w[3] != A_DIV && w[6] != A_DIV) {
        auto idx = [](int64_t op) { return op == A_MAX ? 3 : op == A_MIN ? 4 : int(op); };
        stt_table[idx(w[3])][idx(w[6])](a, s0, bp, out, n);
      } else {
        alu(w[3], a, nullptr, s0, true, w[4] != 0, out, n);
        alu(w[6], out, bp, 0.0f, false, w[7] != 0, out, n);
      }
      break;
    }
    case OP_ACT: {
      // y = fn(x * scale + bias), one pass.
      const bool reducing = w[7] == 2 || w[7] == 3;
      if (!store && reducing && w[3] == F_SQUARE && w[5] < 0 && imm[0] == 1.0 && w[6] == -2) {
        // Dead destination: only the sum of squares is needed (x * 1.0 is x).
        red = lane_sum(a, n, VSquare(), Square());
        break;
      }
      act_table[w[3]](a, operand_at(c, w, 5, imm[0], p), w[6] != -2 ? operand_at(c, w, 6, imm[1], p) : 0.0f,
                      w[6] != -2, out, n);
      if (w[7] == 2 || w[7] == 3) red = reduce_row(A_ADD, out, n);
      break;
    }
    case OP_TRED: {
      const int64_t m = w[4];  // elements per reduction
      const int64_t groups = n / m;
      for (int64_t g = 0; g < groups; ++g) {
        const float r = reduce_row(w[3], a + g * m, m);
        out[g] = w[5] ? -r : r;
      }
      break;
    }
  }
  return red;
}

// ACT after its row: the accumulator registers (2 reduce, 3 reset_reduce) and reduce_res.
void registers_row(Ctx& c, const int64_t* w, int64_t p, float red) {
  float* regs = c.regs[w[9]];
  if (w[7] == 2) regs[p] = combine(A_ADD, regs[p], red);
  else if (w[7] == 3) regs[p] = red;
  if (w[8] >= 0) scatter_row(c, V(c, w, w[8]), p, &regs[p]);
}

// Partitions [lo, hi) of an instruction. `whole`: one thread runs all of an
// instruction whose partitions may touch each other's memory (it stages the
// whole result when dst overlaps a source, and stores before the registers).
void run_instr(Ctx& c, const int64_t* w, const double* imm, int64_t lo, int64_t hi, bool whole, Scratch& sc) {
  const int64_t opcode = w[0];
  if (opcode == OP_NOP) return;
  const View& dst = V(c, w, 0);
  if (opcode == OP_FILL) {
    if (whole) {
      fill_cursor(c, dst.buf, Cursor(dst, 0, 0), imm[0]);
    } else {
      for (int64_t p = lo; p < std::min(hi, dst.shape[0]); ++p) fill_cursor(c, dst.buf, Cursor(dst, 1, p), imm[0]);
    }
    return;
  }
  const View& data = V(c, w, 1);
  if (opcode == OP_COPY) {
    if (whole) {
      run_copy_whole(c, dst, data);
    } else {
      for (int64_t p = lo; p < std::min(hi, dst.shape[0]); ++p)
        copy_cursors(c, dst.buf, c.bufs[dst.buf], Cursor(dst, 1, p), data.buf, c.bufs[data.buf], Cursor(data, 1, p));
    }
    return;
  }
  const int64_t P = data.shape[0];
  const int64_t n = free_numel(data);
  const int64_t dn = free_numel(dst);
  const bool store = w[1] == 0;   // 1: dst is dead after this instruction
  const bool staged = w[2] != 0;  // dst overlaps a source
  if (opcode == OP_ACT && w[7] == 4)  // reset: zero the registers (this thread's lanes)
    for (int64_t p = lo; p < hi; ++p) c.regs[w[9]][p] = 0.0f;
  hi = std::min(hi, P);
  std::vector<float> staging(whole && staged ? std::max<int64_t>(hi - lo, 0) * dn : 0);
  std::vector<float> reds(whole ? std::max<int64_t>(hi - lo, 0) : 0);
  if (n == 1 && dn == 1 && !staged && (opcode == OP_TS || (opcode == OP_ACT && w[7] == 0 && w[8] < 0))) {
    // [P, 1] tiles (per-row statistics): one element per partition, no row machinery.
    const bool bd = c.dtypes[data.buf] == BF16, bo = c.dtypes[dst.buf] == BF16;
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t i = data.offset + p * data.stride[0];
      const float x = bd ? bf16_to_f32(reinterpret_cast<const uint16_t*>(c.bufs[data.buf])[i])
                         : reinterpret_cast<const float*>(c.bufs[data.buf])[i];
      float y;
      if (opcode == OP_TS) {
        const float s0 = operand_at(c, w, 5, imm[0], p);
        y = w[4] ? alu1(w[3], s0, x) : alu1(w[3], x, s0);
        if (w[6] >= 0) {
          const float s1 = operand_at(c, w, 8, imm[1], p);
          y = w[7] ? alu1(w[6], s1, y) : alu1(w[6], y, s1);
        }
      } else {
        y = x * operand_at(c, w, 5, imm[0], p);
        if (w[6] != -2) y = y + operand_at(c, w, 6, imm[1], p);
        y = act1(w[3], y);
      }
      if (!store) continue;
      const int64_t o = dst.offset + p * dst.stride[0];
      if (bo) reinterpret_cast<uint16_t*>(c.bufs[dst.buf])[o] = f32_to_bf16(y);
      else reinterpret_cast<float*>(c.bufs[dst.buf])[o] = y;
    }
    return;
  }
  SttTyped typed = nullptr;  // scalar_tensor_tensor on contiguous rows: one pass, in place
  if (opcode == OP_STT && store && !staged && w[4] == 0 && w[7] == 0 && (w[3] == A_ADD || w[3] == A_MUL) &&
      (w[6] == A_ADD || w[6] == A_MUL) && data.run == n && dst.run == n && dn == n && V(c, w, 2).run == n) {
    const int ta = c.dtypes[data.buf] == BF16, tb = c.dtypes[V(c, w, 2).buf] == BF16, td = c.dtypes[dst.buf] == BF16;
    if (w[3] == A_ADD)
      typed = w[6] == A_ADD ? stt_pick<A_ADD, A_ADD>(ta, tb, td) : stt_pick<A_ADD, A_MUL>(ta, tb, td);
    else
      typed = w[6] == A_ADD ? stt_pick<A_MUL, A_ADD>(ta, tb, td) : stt_pick<A_MUL, A_MUL>(ta, tb, td);
  }
  for (int64_t p = lo; p < hi; ++p) {
    if (typed) {
      const View& b = V(c, w, 2);
      const int64_t ea = c.dtypes[data.buf] == BF16 ? 2 : 4, eb = c.dtypes[b.buf] == BF16 ? 2 : 4;
      const int64_t ed = c.dtypes[dst.buf] == BF16 ? 2 : 4;
      typed(c.bufs[data.buf] + (data.offset + p * data.stride[0]) * ea, operand_at(c, w, 5, imm[0], p),
            c.bufs[b.buf] + (b.offset + p * b.stride[0]) * eb, c.bufs[dst.buf] + (dst.offset + p * dst.stride[0]) * ed,
            n);
      continue;
    }
    float* out = sc.out.data();
    if (whole && staged) out = staging.data() + (p - lo) * dn;
    else if (!staged && store && opcode != OP_TRED) {
      float* d = direct_row(c, dst, p, dn);
      if (d) out = d;
    }
    const float red = compute_row(c, w, imm, data, p, n, out, sc, store);
    if (store && out == sc.out.data()) scatter_row(c, dst, p, out);
    if (opcode == OP_ACT) {
      if (whole) reds[p - lo] = red;
      else registers_row(c, w, p, red);
    }
  }
  if (whole && staged && store)
    for (int64_t p = lo; p < hi; ++p) scatter_row(c, dst, p, staging.data() + (p - lo) * dn);
  if (whole && opcode == OP_ACT)
    for (int64_t p = lo; p < hi; ++p) registers_row(c, w, p, reds[p - lo]);
}

}  // namespace

// Runs a lowered program. Each thread owns a fixed range of partitions for
// every instruction, so row-local instructions need no synchronisation; the
// lowering marks where a barrier is needed (w[14]) and which instructions one
// thread runs whole (w[13]).
extern "C" int nki_run(const int64_t* prog, const double* imms, int64_t ninstr, char** bufs, const int64_t* dtypes,
                       int64_t nthreads, int64_t max_free) {
  Ctx c;
  c.bufs = bufs;
  c.dtypes = dtypes;
  c.prog = prog;
  c.views.resize(ninstr * kMaxViews);
  for (int64_t i = 0; i < ninstr; ++i)
    for (int k = 0; k < kMaxViews; ++k) c.views[i * kMaxViews + k] = read_view(prog + i * kRecord + kHeader + k * kViewWords);
  std::memset(c.regs, 0, sizeof(c.regs));
  const int threads = int(std::max<int64_t>(1, std::min<int64_t>(nthreads, 128)));
  // Rows per step of a segment: about 128 KiB of the widest row, so a step's
  // rows stay in L2 from one record to the next while DMA-like streams stay long.
  const int64_t block = std::max<int64_t>(1, (int64_t(128) << 10) / (4 * std::max<int64_t>(max_free, 1)));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = 128 * t / nt, hi = 128 * (t + 1) / nt;
    Scratch sc;
    sc.size(std::max<int64_t>(max_free, 1));
    for (int64_t i = 0; i < ninstr;) {
      const int64_t* w = prog + i * kRecord;
      if (w[13] != 0) {
#pragma omp barrier
        if (t == 0) run_instr(c, w, imms + i * 2, 0, 128, true, sc);
#pragma omp barrier
        ++i;
        continue;
      }
      if (w[14] != 0) {
#pragma omp barrier
      }
      // A segment of partition-local records (up to the next barrier, whole
      // record or loop iteration) runs a block of partitions at a time: all
      // of its records on rows [p, p + block), then the next block, so rows
      // stay in cache from one instruction to the next (the lowering
      // guarantees no record reads what another writes in a different
      // partition, or HBM another writes).
      int64_t j = i + 1;
      while (j < ninstr && prog[j * kRecord + 13] == 0 && prog[j * kRecord + 14] == 0 && prog[j * kRecord + 15] == 0)
        ++j;
      for (int64_t p = lo; p < hi; p += block)
        for (int64_t k = i; k < j; ++k)
          run_instr(c, prog + k * kRecord, imms + k * 2, p, std::min(p + block, hi), false, sc);
      i = j;
    }
  }
  return 0;
}

extern "C" int nki_layout(int64_t* out) {
  out[0] = kMaxDims;
  out[1] = kMaxViews;
  out[2] = kHeader;
  out[3] = kRecord;
  return 0;
}
