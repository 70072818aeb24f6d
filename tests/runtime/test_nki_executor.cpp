// The NKI executor (csrc/runtime/nki): record tables built by hand, run on
// host memory and launched on a stream over device memory, against values
// computed here; malformed tables are rejected before they run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "csrc/runtime/Error.h"
#include "csrc/runtime/Runtime.h"
#include "csrc/runtime/nki/Executor.h"
#include "csrc/runtime/nki/Kernels.h"
#include "csrc/runtime/nki/Program.h"

namespace nk = neuronrt::nki;

namespace {

struct ViewSpec {
  int64_t buf, offset;
  std::vector<int64_t> shape, stride;
};

// Builds a record table the way nki/_native.py lays it out.
struct Table {
  std::vector<int64_t> words;
  std::vector<double> imms;

  int64_t* add(std::vector<int64_t> header, const std::vector<ViewSpec>& views, double i0 = 0, double i1 = 0) {
    std::vector<int64_t> w(nk::kRecord, 0);
    for (int k = 0; k < nk::kHeader; ++k) w[k] = k < int(header.size()) ? header[k] : -1;
    w[nk::kWholeWord] = w[nk::kBarrierWord] = w[nk::kGroupWord] = 0;
    for (size_t v = 0; v < views.size(); ++v) {
      int64_t* o = &w[nk::kHeader + v * nk::kViewWords];
      o[0] = views[v].buf;
      o[1] = int64_t(views[v].shape.size());
      o[2] = views[v].offset;
      for (int d = 0; d < nk::kMaxDims; ++d) {
        o[3 + d] = d < int(views[v].shape.size()) ? views[v].shape[d] : 1;
        o[3 + nk::kMaxDims + d] = d < int(views[v].stride.size()) ? views[v].stride[d] : 0;
      }
    }
    words.insert(words.end(), w.begin(), w.end());
    imms.push_back(i0);
    imms.push_back(i1);
    return &words[words.size() - nk::kRecord];
  }
};

ViewSpec rows(int64_t buf, int64_t P, int64_t F) { return {buf, 0, {P, F}, {F, 1}}; }

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// out = (x * 2 + 1) * rsqrt(sum(x^2 per row)) for a [P, F] fp32 input:
// tensor_scalar, activation_reduce into registers, activation on [P, 1],
// scalar_tensor_tensor with a per-partition operand. Buffers: 0 x, 1 out
// (bound), 2 sq tile, 3 ss [P, 1], 4 y tile (arena).
std::shared_ptr<nk::Program> example(int64_t P, int64_t F, int64_t out_dtype = nk::F32) {
  Table t;
  // tensor_scalar: y = x * 2 + 1 (dead=0, staged=0, op0, rev0, slot0=-1, op1, rev1, slot1=-1)
  t.add({nk::OP_TS, 0, 0, nk::A_MUL, 0, -1, nk::A_ADD, 0, -1}, {rows(4, P, F), rows(0, P, F)}, 2.0, 1.0);
  // activation_reduce: sq = x^2, ss = sum (fn, 0, scale=-1, bias=-2, cmd=reset_reduce, res slot 2, engine)
  t.add({nk::OP_ACT, 0, 0, nk::F_SQUARE, 0, -1, -2, 3, 2, 1}, {rows(2, P, F), rows(0, P, F), rows(3, P, 1)}, 1.0);
  // ss = rsqrt(ss)
  t.add({nk::OP_ACT, 0, 0, nk::F_RSQRT, 0, -1, -2, 0, -1, 1}, {rows(3, P, 1), rows(3, P, 1)}, 1.0);
  // out = (y * ss) + y (op0 with the [P, 1] operand in slot 3)
  t.add({nk::OP_STT, 0, 0, nk::A_MUL, 0, 3, nk::A_ADD, 0}, {rows(1, P, F), rows(4, P, F), rows(4, P, F), rows(3, P, 1)});
  const int64_t tile = P * F * 4;
  std::vector<nk::Buffer> bufs = {{nk::F32, P * F, -1}, {out_dtype, P * F, -1}, {nk::F32, P * F, 0},
                                  {nk::F32, P, tile}, {nk::F32, P * F, tile + 512}};
  return std::make_shared<nk::Program>(t.words, t.imms, bufs, tile * 2 + 512, "example");
}

std::vector<float> expected(const std::vector<float>& x, int64_t P, int64_t F) {
  std::vector<float> out(P * F);
  for (int64_t p = 0; p < P; ++p) {
    // F < 8: torch's scalar sum, 4 accumulators over groups of 4, the
    // remainder into the first, then the 4 added in order.
    float acc[4] = {0, 0, 0, 0};
    auto sq = [&](int64_t f) { return x[p * F + f] * x[p * F + f]; };
    for (int64_t f = 0; f < F / 4 * 4; ++f) acc[f % 4] += sq(f);
    for (int64_t f = F / 4 * 4; f < F; ++f) acc[0] += sq(f);
    const float ss = ((acc[0] + acc[1]) + acc[2]) + acc[3];
    const float r = 1.0f / std::sqrt(ss);
    for (int64_t f = 0; f < F; ++f) {
      const float y = x[p * F + f] * 2.0f + 1.0f;
      out[p * F + f] = y * r + y;
    }
  }
  return out;
}

// These programs are small: without NKI_SPLIT_SMALL the executor would run
// them on one thread whatever the thread count asked.
[[maybe_unused]] const int kSplitSmall = setenv("NKI_SPLIT_SMALL", "1", 1);

std::vector<float> input(int64_t n) {
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = float((i * 37) % 23) / 7.0f - 1.5f;
  return x;
}

}  // namespace

TEST(NkiExecutor, RunsARecordTableOnHostMemory) {
  const int64_t P = 128, F = 5;
  auto prog = example(P, F);
  auto x = input(P * F);
  std::vector<float> out(P * F, 0.0f);
  for (int threads : {1, 2, 3}) {
    nk::execute(*prog, {x.data(), out.data()}, threads);
    auto ref = expected(x, P, F);
    for (int64_t i = 0; i < P * F; ++i) ASSERT_EQ(out[i], ref[i]) << i << ", " << threads << " threads";
  }
}

TEST(NkiExecutor, RoundsBf16OnStore) {
  const int64_t P = 7, F = 3;
  auto prog = example(P, F, nk::BF16);
  auto x = input(P * F);
  std::vector<uint16_t> out(P * F, 0);
  nk::execute(*prog, {x.data(), out.data()}, 2);
  auto ref = expected(x, P, F);
  for (int64_t i = 0; i < P * F; ++i) EXPECT_EQ(out[i], to_bf16(ref[i])) << i << " " << from_bf16(out[i]);
}

TEST(NkiExecutor, LaunchesOnAStreamOverDeviceMemory) {
  const int64_t P = 64, F = 6;
  auto prog = example(P, F);
  auto x = input(P * F);
  void* dx = neuronrt::malloc(0, x.size() * 4);
  void* dout = neuronrt::malloc(0, x.size() * 4);
  neuronrt::Stream& s = neuronrt::current_stream(0);
  neuronrt::memcpy(dx, x.data(), x.size() * 4, neuronrt::MemcpyKind::HostToDevice, s);
  const uint64_t before = s.issued();
  nk::ProgramKernel kernel(prog, {dx, dout}, 2);
  EXPECT_STREQ(kernel.name(), "nki::example");
  s.launch([&] { kernel.run(); }, kernel.name());
  EXPECT_EQ(s.issued(), before + 1);
  std::vector<float> out(x.size());
  neuronrt::memcpy(out.data(), dout, out.size() * 4, neuronrt::MemcpyKind::DeviceToHost, s);
  EXPECT_EQ(out, expected(x, P, F));
  neuronrt::free(dx);
  neuronrt::free(dout);
}

TEST(NkiExecutor, AliasedBoundBuffersStillCorrect) {
  // out written in place over x: elementwise records read each element
  // before writing it, and aliasing forces one thread.
  const int64_t P = 16, F = 4;
  Table t;
  t.add({nk::OP_TS, 0, 0, nk::A_ADD, 0, -1, -1, 0, -1}, {rows(1, P, F), rows(0, P, F)}, 3.0);
  auto prog = nk::Program(t.words, t.imms, {{nk::F32, P * F, -1}, {nk::F32, P * F, -1}}, 0, "inplace");
  auto x = input(P * F);
  auto ref = x;
  for (auto& v : ref) v += 3.0f;
  nk::execute(prog, {x.data(), x.data()}, 4);
  EXPECT_EQ(x, ref);
}

TEST(NkiExecutor, RejectsMalformedTables) {
  const int64_t P = 8, F = 4;
  std::vector<nk::Buffer> two = {{nk::F32, P * F, -1}, {nk::F32, P * F, -1}};
  auto build = [&](auto edit) {
    Table t;
    int64_t* w = t.add({nk::OP_TS, 0, 0, nk::A_ADD, 0, -1, -1, 0, -1}, {rows(1, P, F), rows(0, P, F)}, 1.0);
    edit(w, t);
    return nk::Program(t.words, t.imms, two, 0, "bad");
  };
  auto throws = [&](auto edit, const char* what) {
    try {
      build(edit);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const neuronrt::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  build([](int64_t*, Table&) {});  // the unedited table is fine
  throws([](int64_t* w, Table&) { w[0] = 99; }, "unknown opcode 99");
  throws([](int64_t* w, Table&) { w[3] = 42; }, "unknown ALU op 42");
  throws([](int64_t* w, Table&) { w[nk::kHeader + 2] = 1; }, "view 0 spans elements [1, 32] of buffer 1 of 32");
  throws([](int64_t* w, Table&) { w[nk::kHeader + nk::kViewWords] = 7; }, "view 1 names no buffer (7)");
  throws([](int64_t* w, Table&) { w[5] = 4; }, "operand slot 4 names no operand view");
  throws([](int64_t* w, Table&) { w[nk::kHeader + 3] = 200; }, "spans elements");
  throws([](int64_t*, Table& t) { t.imms.pop_back(); }, "2 immediates per record");
  throws([](int64_t*, Table& t) { t.words.pop_back(); }, "whole number");
  Table fused;  // a scalar_tensor_tensor's fused activation (w[8]) is a known function
  fused.add({nk::OP_STT, 0, 0, nk::A_MUL, 0, -1, nk::A_MUL, 0, nk::kNumFn}, {rows(1, P, F), rows(0, P, F), rows(0, P, F)});
  EXPECT_THROW(nk::Program(fused.words, fused.imms, two, 0, "bad"), neuronrt::Error);
  EXPECT_THROW(nk::Program({}, {}, {{nk::F32, 4, 0}}, 8, "arena"), neuronrt::Error);  // 16 bytes > 8
  EXPECT_THROW(nk::Program({}, {}, {{nk::kNumDTypes, 4, -1}}, 0, "dtype"), neuronrt::Error);
  auto ok = build([](int64_t*, Table&) {});
  std::vector<float> a(P * F);
  EXPECT_THROW(nk::execute(ok, {a.data()}, 1), neuronrt::Error);  // one bound buffer of two
}

TEST(NkiExecutor, ScalarTensorTensorWithFusedActivation) {
  // w[8]: data goes through an activation first (nki/_native.py _fuse_activation):
  // out = (relu(x) * 2) * y, fp32 and bf16 data (the one-pass row forms) and fp16
  // (gathered rows); 700 columns: a 512-element chunk and a tail. Exact here.
  const int64_t P = 3, F = 700;
  for (int64_t dt : {int64_t(nk::F32), int64_t(nk::BF16), int64_t(nk::F16)}) {
    Table t;
    t.add({nk::OP_STT, 0, 0, nk::A_MUL, 0, -1, nk::A_MUL, 0, nk::F_RELU}, {rows(2, P, F), rows(0, P, F), rows(1, P, F)},
          2.0);
    std::vector<float> xf(P * F), y(P * F), out(P * F);
    std::vector<uint16_t> xh(P * F);
    for (int64_t i = 0; i < P * F; ++i) {
      xf[i] = float(i % 17) - 8.0f;
      y[i] = float(i % 5) * 0.5f;
      xh[i] = dt == nk::BF16 ? to_bf16(xf[i]) : uint16_t(0);
    }
    if (dt == nk::F16)  // small integers: fp16 bits by hand (sign, exponent, 10-bit fraction)
      for (int64_t i = 0; i < P * F; ++i) {
        const float v = std::fabs(xf[i]);
        const int e = v == 0 ? 0 : int(std::floor(std::log2(v)));
        xh[i] = uint16_t((xf[i] < 0 ? 0x8000 : 0) | (v == 0 ? 0 : ((e + 15) << 10) | int((v / std::ldexp(1.0f, e) - 1) * 1024)));
      }
    nk::Program prog(t.words, t.imms, {{dt, P * F, -1}, {nk::F32, P * F, -1}, {nk::F32, P * F, -1}}, 0, "fused");
    nk::execute(prog, {dt == nk::F32 ? static_cast<void*>(xf.data()) : xh.data(), y.data(), out.data()}, 1);
    for (int64_t i = 0; i < P * F; ++i) ASSERT_EQ(out[i], std::max(xf[i], 0.0f) * 2.0f * y[i]) << dt << " " << i;
  }
}

TEST(NkiExecutor, MatmulOverwritesThenAccumulates) {
  // dst[M, N] = st[K, M]^T @ mv[K, N], then the same added (accumulate flag).
  const int64_t K = 3, M = 2, N = 5;
  Table t;
  int64_t* w = t.add({nk::OP_MM, 0, 0, 0}, {rows(2, M, N), rows(0, K, M), rows(1, K, N)});
  w[nk::kWholeWord] = 1;
  w = t.add({nk::OP_MM, 0, 0, 1}, {rows(2, M, N), rows(0, K, M), rows(1, K, N)});
  w[nk::kWholeWord] = 1;
  std::vector<nk::Buffer> bufs = {{nk::F32, K * M, -1}, {nk::F32, K * N, -1}, {nk::F32, M * N, -1}};
  nk::Program prog(t.words, t.imms, bufs, 0, "mm");
  auto st = input(K * M), mv = input(K * N + 3);
  std::vector<float> out(M * N, 0.0f);
  nk::execute(prog, {st.data(), mv.data() + 3, out.data()}, 2);
  // k in order; multiply-adds fused in the AVX2/AVX-512 builds, product then sum in the generic one.
  const bool fused = std::string(nk::kernel_isa()) != "generic";
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const float a = st[k * M + m], b = mv[3 + k * N + n];
        acc = fused ? std::fma(a, b, acc) : acc + a * b;
      }
      EXPECT_EQ(out[m * N + n], acc + acc) << m << "," << n;
    }
  // Split by rows (each thread its rows of dst): the same bits.
  t.words[nk::kWholeWord] = t.words[nk::kRecord + nk::kWholeWord] = 0;
  nk::Program split(t.words, t.imms, bufs, 0, "mm");
  std::vector<float> rows_out(M * N, 0.0f);
  nk::execute(split, {st.data(), mv.data() + 3, rows_out.data()}, 2);
  EXPECT_EQ(rows_out, out);
  // A split matmul writing a buffer it reads is rejected (threads would race).
  Table self;
  self.add({nk::OP_MM, 0, 0, 0}, {rows(1, M, N), rows(0, K, M), rows(1, K, N)});
  EXPECT_THROW(nk::Program(self.words, self.imms, {{nk::F32, K * M, -1}, {nk::F32, K * N, -1}}, 0, "mm"),
               neuronrt::Error);
}

// bf16 operands: the AVX-512 build multiplies full 4 x 64 blocks with
// VDPBF16PS where the CPU has it (Kernels.inc matmul_bf16_dot); every build
// must give the k-ordered multiply-adds' bits. Blocks and tails, an odd K,
// a transposed stationary view (k contiguous, read a row at a time), accumulation into the fp32
// destination, and values small enough that partial sums could be denormal
// (the instruction would flush them: those run the fused multiply-adds), in
// either stationary layout.
TEST(NkiExecutor, Bf16MatmulKeepsTheKOrder) {
  const bool fused = std::string(nk::kernel_isa()) != "generic";
  for (int variant = 0; variant < 5; ++variant) {
    const bool transposed = variant == 1 || variant == 4, tiny = variant == 2 || variant == 4;
    // (transposed: M = 37, nine blocks of 4 rows and a tail row; K / 2 = 33 pairs: two loads of 16 and a masked one)
    const int64_t K = variant == 3 ? 67 : 66, M = transposed ? 37 : 9, N = 130;
    Table t;
    // Stationary [K, M]: row-major, or the transpose of an [M, K] buffer.
    ViewSpec st = transposed ? ViewSpec{0, 0, {K, M}, {1, K}} : rows(0, K, M);
    int64_t* w = t.add({nk::OP_MM, 0, 0, 0}, {rows(2, M, N), st, rows(1, K, N)});
    w[nk::kWholeWord] = 1;
    w = t.add({nk::OP_MM, 0, 0, 1}, {rows(2, M, N), st, rows(1, K, N)});
    w[nk::kWholeWord] = 1;
    std::vector<nk::Buffer> bufs = {{nk::BF16, K * M, -1}, {nk::BF16, K * N, -1}, {nk::F32, M * N, -1}};
    nk::Program prog(t.words, t.imms, bufs, 0, "mm_bf16");
    std::vector<uint16_t> a(K * M), b(K * N);
    const float scale = tiny ? 1e-19f : 1.0f;
    for (int64_t i = 0; i < K * M; ++i) a[i] = to_bf16(scale * (float((i * 37) % 23) / 7.0f - 1.5f));
    for (int64_t i = 0; i < K * N; ++i) b[i] = to_bf16(scale * (float((i * 53) % 29) / 5.0f - 2.75f));
    std::vector<float> out(M * N, 0.0f);
    nk::execute(prog, {a.data(), b.data(), out.data()}, 1);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
          const float x = from_bf16(a[transposed ? m * K + k : k * M + m]), y = from_bf16(b[k * N + n]);
          acc = fused ? std::fma(x, y, acc) : acc + x * y;
        }
        ASSERT_EQ(out[m * N + n], acc + acc) << variant << ": " << m << "," << n;
      }
  }
}

TEST(NkiExecutor, TranscendentalActivation) {
  // exp(x * 0.5 - 1) per element within 1 ulp of the rounded exact value (the
  // executor's vectorised exp); inf, -inf, NaN, overflow and underflow as libm.
  const int64_t P = 9, F = 11;
  Table t;
  t.add({nk::OP_ACT, 0, 0, nk::F_EXP, 0, -1, -1, 0, -1, 1}, {rows(1, P, F), rows(0, P, F)}, 0.5, -1.0);
  nk::Program prog(t.words, t.imms, {{nk::F32, P * F, -1}, {nk::F32, P * F, -1}}, 0, "exp");
  auto x = input(P * F);
  const float inf = std::numeric_limits<float>::infinity();
  x[0] = inf, x[1] = -inf, x[2] = std::numeric_limits<float>::quiet_NaN(), x[3] = 200.0f, x[4] = -250.0f;
  std::vector<float> out(P * F);
  nk::execute(prog, {x.data(), out.data()}, 1);
  for (int64_t i = 0; i < P * F; ++i) {
    const float ref = float(std::exp(double(x[i] * 0.5f + -1.0f)));
    if (std::isnan(ref)) EXPECT_TRUE(std::isnan(out[i])) << i;
    else if (std::isinf(ref) || ref == 0.0f) EXPECT_EQ(out[i], ref) << i;
    else EXPECT_LE(std::fabs(out[i] - ref), std::nextafter(ref, inf) - ref) << i;
  }
}

namespace {

// One copy record from buffer 0 ([1, n] of `from`) to buffer 1 ([1, n] of `to`).
template <class D, class S>
std::vector<D> copy_as(const std::vector<S>& src, int64_t from, int64_t to) {
  const int64_t n = int64_t(src.size());
  Table t;
  t.add({nk::OP_COPY}, {rows(1, 1, n), rows(0, 1, n)});
  nk::Program prog(t.words, t.imms, {{from, n, -1}, {to, n, -1}}, 0, "convert");
  std::vector<D> out(n);
  nk::execute(prog, {const_cast<S*>(src.data()), out.data()}, 1);
  return out;
}

}  // namespace

TEST(NkiExecutor, StoresRoundLikeTorchConversions) {
  const float inf = INFINITY, nan = NAN;
  const std::vector<float> x = {1.0f, 65504.0f, 65519.0f, 65520.0f, 0x1p-24f, 0x1p-25f, 3 * 0x1p-25f, -2.5f,
                                0.1f, -inf, nan};
  // fp16: round to nearest even, overflow to inf, subnormals kept.
  auto h = copy_as<uint16_t>(x, nk::F32, nk::F16);
  const std::vector<uint16_t> want_h = {0x3C00, 0x7BFF, 0x7BFF, 0x7C00, 0x0001, 0x0000, 0x0002, 0xC100, 0x2E66, 0xFC00};
  for (size_t i = 0; i < want_h.size(); ++i) EXPECT_EQ(h[i], want_h[i]) << i;
  EXPECT_EQ(h.back() & 0x7C00, 0x7C00);
  EXPECT_NE(h.back() & 0x3FF, 0);
  // fp8 e4m3fn saturates at +-448 (infinities too); e5m2 overflows to inf.
  const std::vector<float> y = {1.0f, 448.0f, 500.0f, inf, -inf, nan, 0x1p-9f, 0x1p-10f, 3 * 0x1p-10f, -2.5f,
                                57344.0f, 61439.0f, 61440.0f, 0x1p-16f};
  auto e4 = copy_as<uint8_t>(y, nk::F32, nk::F8E4M3);
  const std::vector<uint8_t> want_e4 = {0x38, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x01, 0x00, 0x02, 0xC2, 0x7E, 0x7E, 0x7E,
                                        0x00};
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(e4[i], want_e4[i]) << i;
  auto e5 = copy_as<uint8_t>(y, nk::F32, nk::F8E5M2);
  const std::vector<uint8_t> want_e5 = {0x3C, 0x5F, 0x60, 0x7C, 0xFC, 0x7F, 0x18, 0x14, 0x1A, 0xC1, 0x7B, 0x7B, 0x7C,
                                        0x01};
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(e5[i], want_e5[i]) << i;
  // Loads are exact: every fp8 value back to fp32 and to fp8 again.
  std::vector<uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[i] = uint8_t(i);
  for (int64_t f8 : {int64_t(nk::F8E4M3), int64_t(nk::F8E5M2)}) {
    auto back = copy_as<uint8_t>(copy_as<float>(all, f8, nk::F32), nk::F32, f8);
    for (int i = 0; i < 256; ++i) {
      const bool is_nan = f8 == nk::F8E4M3 ? (i & 0x7F) == 0x7F : (i & 0x7F) > 0x7C;
      EXPECT_EQ(back[i], is_nan ? (i & 0x80) | 0x7F : i) << f8 << " " << i;
    }
  }
  // Integers: round half to even, then int32 truncation (INT32_MIN out of
  // range or NaN) and the low bits for narrower types.
  const std::vector<float> z = {2.5f, 3.5f, -2.5f, 300.0f, nan, 1e10f, -2147483648.0f, 2147483520.0f};
  auto i32 = copy_as<int32_t>(z, nk::F32, nk::I32);
  const std::vector<int32_t> want_i32 = {2, 4, -2, 300, INT32_MIN, INT32_MIN, INT32_MIN, 2147483520};
  for (size_t i = 0; i < z.size(); ++i) EXPECT_EQ(i32[i], want_i32[i]) << i;
  auto i8 = copy_as<int8_t>(z, nk::F32, nk::I8);
  const std::vector<int8_t> want_i8 = {2, 4, -2, 44, 0, 0, 0, -128};
  for (size_t i = 0; i < z.size(); ++i) EXPECT_EQ(i8[i], want_i8[i]) << i;
}

TEST(NkiExecutor, IntegerCopiesDoNotRoundThroughFp32) {
  // int32 -> int32 keeps every bit; int32 -> int8/uint16 wraps; int32 -> fp32 rounds.
  const std::vector<int32_t> x = {16777217, 300, -1, 70000};
  EXPECT_EQ((copy_as<int32_t>(x, nk::I32, nk::I32)), x);
  EXPECT_EQ((copy_as<int8_t>(x, nk::I32, nk::I8)), (std::vector<int8_t>{1, 44, -1, 112}));
  EXPECT_EQ((copy_as<uint16_t>(x, nk::I32, nk::U16)), (std::vector<uint16_t>{1, 300, 65535, 4464}));
  EXPECT_EQ((copy_as<float>(x, nk::I32, nk::F32)), (std::vector<float>{16777216.0f, 300.0f, -1.0f, 70000.0f}));
}

TEST(NkiExecutor, TransposedCopyRunsWhole) {
  // dst[4, 3] = src[3, 4]^T through a permuted view of the source (a record
  // that mixes partitions: one thread runs it whole).
  Table t;
  int64_t* w = t.add({nk::OP_COPY}, {rows(1, 4, 3), {0, 0, {4, 3}, {1, 4}}});
  w[nk::kWholeWord] = 1;
  nk::Program prog(t.words, t.imms, {{nk::F32, 12, -1}, {nk::BF16, 12, -1}}, 0, "transpose");
  auto src = input(12);
  std::vector<uint16_t> out(12);
  nk::execute(prog, {src.data(), out.data()}, 2);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(out[r * 3 + c], to_bf16(src[c * 4 + r])) << r << "," << c;
}

// The next step's HBM rows are fetched in step with the streamed stores:
// every line of every planned row once, spread over the planned bytes, and
// nothing past the last row.
TEST(NkiExecutor, PrefetchCoversThePlannedRowsOnce) {
  alignas(64) static char hbm[8 * 4096 + 4096];
  neuronrt::nki::detail::Prefetch pf;
  pf.ranges[0] = {hbm, 4096, 4096};           // whole aligned rows: 64 lines each
  pf.ranges[1] = {hbm + 8 + 8 * 4096, 0, 100};  // 100 bytes from byte 8 of a line: 2 lines
  pf.nranges = 2;
  const int64_t rows = 4, fetch = rows * (4096 + 164), streamed = rows * 4096;
  pf.start(3, 3 + rows, fetch, streamed);
  pf.streamed(streamed / 2);
  EXPECT_GE(pf.issued, rows * 66 / 2 - 1);
  EXPECT_LE(pf.issued, rows * 66 / 2 + 3);
  pf.streamed(streamed / 2);
  EXPECT_EQ(pf.issued, rows * 66);
  EXPECT_EQ(pf.next, nullptr);
  pf.streamed(streamed);  // nothing left to fetch
  EXPECT_EQ(pf.issued, rows * 66);
  pf.clear();
  pf.streamed(streamed);
  EXPECT_EQ(pf.next, nullptr);
}

// OP_SEL, OP_IOTA and OP_SCAN (the records of nl.where, iota/affine_select
// and tensor_tensor_scan) on a [P, F] fp32 input. Buffers: 0 x, 1 y (bound),
// 2 sel, 3 iota, 4 scan (bound outputs).
TEST(NkiExecutor, SelectIotaScanRecords) {
  const int64_t P = 3, F = 5;
  Table t;
  // sel = x != 0 ? y : -9 (x in slot 1 is the condition, y in slot 2, imm[1] for the other)
  t.add({nk::OP_SEL, 0, 0, 2, -1}, {rows(2, P, F), rows(0, P, F), rows(1, P, F)}, 0.0, -9.0);
  // iota: 2 terms [[2, 1], [0.5, 5]]: offset 3, channel multiplier 10
  double half = 0.5, two = 2.0;
  int64_t hb, tb;
  std::memcpy(&hb, &half, 8);
  std::memcpy(&tb, &two, 8);
  t.add({nk::OP_IOTA, 0, 0, 2, 1, 5, 0, 0, tb, hb, 0, 0}, {rows(3, P, F)}, 3.0, 10.0);
  // scan: r = (x * r) + y from r = 0.5
  t.add({nk::OP_SCAN, 0, 0, nk::A_MUL, 0, nk::A_ADD, 0, -1}, {rows(4, P, F), rows(0, P, F), rows(1, P, F)}, 0.5);
  std::vector<nk::Buffer> bufs;
  for (int b = 0; b < 5; ++b) bufs.push_back({nk::F32, P * F, -1});
  nk::Program prog(t.words, t.imms, bufs, 64, "sel_iota_scan");
  std::vector<float> x(P * F), y(P * F), sel(P * F), iota(P * F), scan(P * F);
  for (int64_t i = 0; i < P * F; ++i) {
    x[i] = i % 3 == 0 ? 0.0f : float(i) / 4.0f;
    y[i] = float(i) - 7.0f;
  }
  x[1] = NAN;  // NaN is true
  nk::execute(prog, {x.data(), y.data(), sel.data(), iota.data(), scan.data()}, 2);
  for (int64_t p = 0; p < P; ++p) {
    float r = 0.5f;
    for (int64_t f = 0; f < F; ++f) {
      const int64_t i = p * F + f;
      EXPECT_EQ(sel[i], x[i] != 0.0f ? y[i] : -9.0f) << i;
      EXPECT_EQ(iota[i], float(double(p) * 10.0 + 3.0 + 0.5 * double(f))) << i;
      r = x[i] * r + y[i];
      EXPECT_TRUE(scan[i] == r || (scan[i] != scan[i] && r != r)) << i;
    }
  }
  // Malformed: an iota pattern that does not cover the row; a select slot naming no view.
  Table bad;
  bad.add({nk::OP_IOTA, 0, 0, 1, 4, 0, 0, 0, tb}, {rows(3, P, F)});
  EXPECT_THROW(nk::Program(bad.words, bad.imms, bufs, 64, "bad"), neuronrt::Error);
  Table bad2;
  bad2.add({nk::OP_SEL, 0, 0, 4, -1}, {rows(2, P, F), rows(0, P, F)});
  EXPECT_THROW(nk::Program(bad2.words, bad2.imms, bufs, 64, "bad2"), neuronrt::Error);
}

// OP_REG (the register update of a reducing instruction) and OP_VAR (torch's
// Welford variance). Buffers: 0 r [P, 1], 1 res [P, 1], 2 x [P, F], 3 var [P, 1].
TEST(NkiExecutor, RegisterAndVarianceRecords) {
  const int64_t P = 4, F = 9;
  Table t;
  t.add({nk::OP_REG, 0, 0, 3, nk::A_MAX, 0, 0, 0, -1}, {rows(0, P, 1), rows(0, P, 1)});  // reset_reduce: regs = r
  t.add({nk::OP_REG, 0, 0, 2, nk::A_MAX, 0, 0, 0, -1}, {rows(0, P, 1), rows(0, P, 1)});  // reduce: max(regs, r)
  t.add({nk::OP_REG, 0, 0, 5, nk::A_ADD, 0, 1, 1, -1}, {rows(1, P, 1), rows(0, P, 1)}, 2.5);  // -(2.5 + r)
  t.add({nk::OP_VAR, 0, 0, F}, {rows(3, P, 1), rows(2, P, F)});
  std::vector<nk::Buffer> bufs = {{nk::F32, P, -1}, {nk::F32, P, -1}, {nk::F32, P * F, -1}, {nk::F32, P, -1}};
  nk::Program prog(t.words, t.imms, bufs, 64, "reg_var");
  std::vector<float> r = {1.0f, -2.0f, 0.25f, 8.0f}, res(P), x = input(P * F), var(P);
  nk::execute(prog, {r.data(), res.data(), x.data(), var.data()}, 2);
  for (int64_t p = 0; p < P; ++p) {
    EXPECT_EQ(res[p], -(0.0f + ((0.0f + 2.5f) + r[p]))) << p;
    double mean = 0, m2 = 0;
    for (int64_t f = 0; f < F; ++f) {
      const double v = x[p * F + f], d = v - mean;
      mean += d / double(f + 1);
      m2 += d * (v - mean);
    }
    EXPECT_EQ(var[p], float(m2 / F)) << p;
  }
  Table bad;
  bad.add({nk::OP_REG, 0, 0, 7, nk::A_ADD, 0, 0, 0, -1}, {rows(0, P, 1), rows(0, P, 1)});
  EXPECT_THROW(nk::Program(bad.words, bad.imms, bufs, 64, "bad"), neuronrt::Error);
}

// OP_BITS: int64 bitvector ops on integer rows, stored with wrapping.
// Buffers: 0 a int32, 1 b int8, 2 out int8, 3 and-reduction int16 [P, 1].
TEST(NkiExecutor, BitvectorRecords) {
  const int64_t P = 2, F = 4;
  Table t;
  t.add({nk::OP_BITS, 0, 0, 0, nk::B_SHL, 0, -1, -1, 0, -1, 0}, {rows(2, P, F), rows(0, P, F), rows(1, P, F)});
  t.add({nk::OP_BITS, 0, 0, 2, nk::B_AND, 0, -1, -1, 0, -1, F}, {rows(3, P, 1), rows(0, P, F)});
  std::vector<nk::Buffer> bufs = {{nk::I32, P * F, -1}, {nk::I8, P * F, -1}, {nk::I8, P * F, -1}, {nk::I16, P, -1}};
  nk::Program prog(t.words, t.imms, bufs, 64, "bits");
  std::vector<int32_t> a = {3, -1, 1 << 30, 7, 0x7fff, 0x3ff0, 0x1ff0, -2};
  std::vector<int8_t> b = {1, 70, 2, -1, 4, 0, 63, 3}, out(P * F);
  std::vector<int16_t> red(P);
  nk::execute(prog, {a.data(), b.data(), out.data(), red.data()}, 1);
  for (int64_t i = 0; i < P * F; ++i) {
    const int64_t s = b[i], x = a[i];
    const int64_t want = (s < 0 || s >= 64) ? 0 : int64_t(uint64_t(x) << s);
    EXPECT_EQ(out[i], int8_t(want)) << i;
  }
  EXPECT_EQ(red[0], int16_t(3 & -1 & (1 << 30) & 7));
  EXPECT_EQ(red[1], int16_t(0x7fff & 0x3ff0 & 0x1ff0 & -2));
  Table bad;  // a bitvector op on a float buffer
  bad.add({nk::OP_BITS, 0, 0, 0, nk::B_AND, 0, -1, -1, 0, -1, 0}, {rows(0, P, F), rows(0, P, F), rows(0, P, F)});
  std::vector<nk::Buffer> fbufs = {{nk::F32, P * F, -1}};
  EXPECT_THROW(nk::Program(bad.words, bad.imms, fbufs, 64, "bad"), neuronrt::Error);
}

namespace {
int64_t* whole(int64_t* w) {
  w[nk::kWholeWord] = 1;
  return w;
}
}  // namespace

// OP_PRED: a reduction over the partitions, in partition order; one thread.
TEST(NkiExecutor, PartitionReduceRecord) {
  const int64_t P = 3, F = 2;
  Table t;
  whole(t.add({nk::OP_PRED, 0, 0, nk::A_ADD}, {rows(1, 1, F), rows(0, P, F)}));
  whole(t.add({nk::OP_PRED, 0, 0, nk::A_MUL}, {rows(2, 1, F), rows(0, P, F)}));
  whole(t.add({nk::OP_PRED, 0, 0, nk::A_MAX}, {rows(3, 1, F), rows(0, P, F)}));
  std::vector<nk::Buffer> bufs = {{nk::F32, P * F, -1}, {nk::F32, F, -1}, {nk::F32, F, -1}, {nk::I32, F, -1}};
  nk::Program prog(t.words, t.imms, bufs, 64, "pred");
  std::vector<float> x = {1e8f, 2.0f, -1e8f, 3.0f, 1.0f, -4.0f}, sum(F), prod(F);
  std::vector<int32_t> mx(F);
  nk::execute(prog, {x.data(), sum.data(), prod.data(), mx.data()}, 2);
  EXPECT_EQ(sum[0], (1e8f + -1e8f) + 1.0f);  // in order: 1, not 0
  EXPECT_EQ(sum[1], 1.0f);
  EXPECT_EQ(prod[1], -24.0f);
  EXPECT_EQ(mx[0], 100000000);
  EXPECT_EQ(mx[1], 3);
  Table bad;  // must run whole
  bad.add({nk::OP_PRED, 0, 0, nk::A_ADD}, {rows(1, 1, F), rows(0, P, F)});
  EXPECT_THROW(nk::Program(bad.words, bad.imms, bufs, 64, "bad"), neuronrt::Error);
}

// OP_TOPK: max8 (NaN first, descending) and find_index8 (-1 as uint32 when absent).
TEST(NkiExecutor, TopKRecords) {
  const int64_t P = 1, F = 10;
  Table t;
  t.add({nk::OP_TOPK, 0, 0, 0}, {rows(1, P, 8), rows(0, P, F)});
  t.add({nk::OP_TOPK, 0, 0, 1}, {rows(2, P, 8), rows(0, P, F), rows(1, P, 8)});
  std::vector<nk::Buffer> bufs = {{nk::F32, F, -1}, {nk::F32, 8, -1}, {nk::U32, 8, -1}};
  nk::Program prog(t.words, t.imms, bufs, 64, "topk");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {3, 9, 1, nan, 7, 7, -2, 5, 0, 8}, top(8);
  std::vector<uint32_t> idx(8);
  nk::execute(prog, {x.data(), top.data(), idx.data()}, 1);
  EXPECT_TRUE(std::isnan(top[0]));
  EXPECT_EQ(std::vector<float>(top.begin() + 1, top.end()), (std::vector<float>{9, 8, 7, 7, 5, 3, 1}));
  EXPECT_EQ(idx, (std::vector<uint32_t>{0xFFFFFFFFu, 1, 9, 4, 4, 7, 0, 2}));
}

// OP_RAND: Philox4x32-10 words of (key, element / 4, subsequence), top 24 bits.
TEST(NkiExecutor, RandomRecordIsPhilox) {
  const int64_t P = 2, F = 5;
  Table t;
  whole(t.add({nk::OP_RAND, 0, 0, 0, 3, 0}, {rows(1, P, F), rows(0, 1, 2)}));
  whole(t.add({nk::OP_RAND, 0, 0, 1, 3, 1}, {rows(3, P, F), rows(0, 1, 2), rows(2, P, F)}, 0.5));
  std::vector<nk::Buffer> bufs = {{nk::U32, 2, -1}, {nk::F32, P * F, -1}, {nk::F32, P * F, -1}, {nk::BOOL, P * F, -1}};
  nk::Program prog(t.words, t.imms, bufs, 64, "rand");
  const uint64_t key = 0x0123456789ABCDEFull;
  std::vector<uint32_t> seed = {uint32_t(key), uint32_t(key >> 32)};
  std::vector<float> u(P * F), x(P * F, 2.0f);
  std::vector<uint8_t> kept(P * F);
  nk::execute(prog, {seed.data(), u.data(), x.data(), kept.data()}, 1);
  for (int64_t i = 0; i < P * F; ++i) {
    const auto r = neuronrt::philox4x32(key, uint64_t(i / 4), 3);
    const float want = float(r[i % 4] >> 8) * (1.0f / 16777216.0f);
    EXPECT_EQ(u[i], want) << i;
    EXPECT_EQ(kept[i], want >= 0.5f ? 1 : 0) << i;  // bool dst: x != 0
  }
}

// uint32 and bool stores: through int64 for uint32 (-1 wraps; NaN gives 0), x != 0 for bool.
TEST(NkiExecutor, Uint32AndBoolStores) {
  const int64_t F = 6;
  Table t;
  t.add({nk::OP_COPY}, {rows(1, 1, F), rows(0, 1, F)});
  t.add({nk::OP_COPY}, {rows(2, 1, F), rows(0, 1, F)});
  std::vector<nk::Buffer> bufs = {{nk::F32, F, -1}, {nk::U32, F, -1}, {nk::BOOL, F, -1}};
  nk::Program prog(t.words, t.imms, bufs, 64, "u32");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {-1.0f, 2.5f, 3.5f, 4e9f, nan, -0.0f};
  std::vector<uint32_t> u(F);
  std::vector<uint8_t> b(F);
  nk::execute(prog, {x.data(), u.data(), b.data()}, 1);
  EXPECT_EQ(u, (std::vector<uint32_t>{0xFFFFFFFFu, 2, 4, 4000000000u, 0, 0}));
  EXPECT_EQ(b, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0}));
}

// out = x * (n + 1): out = x, then a device loop adds x while a counter
// counted down from n is positive. Buffers: 0 x, 1 out (bound), 2 the
// counter, 3 the condition ([1, 1] fp32 tiles in the arena).
nk::Program counting_loop(int64_t P, int64_t F, double n, int64_t cap) {
  const ViewSpec cnt{2, 0, {1, 1}, {1, 1}}, flag{3, 0, {1, 1}, {1, 1}};
  Table t;
  t.add({nk::OP_FILL}, {cnt}, n);
  t.add({nk::OP_COPY}, {rows(1, P, F), rows(0, P, F)});
  t.add({nk::OP_TS, 0, 0, nk::A_GT, 0, -1, -1, 0, -1}, {flag, cnt}, 0.0);
  t.add({nk::OP_WHILE, 0, 0, 7, cap}, {flag})[nk::kWholeWord] = 1;
  t.add({nk::OP_TS, 0, 0, nk::A_SUB, 0, -1, -1, 0, -1}, {cnt, cnt}, 1.0);
  t.add({nk::OP_TT, 0, 0, nk::A_ADD}, {rows(1, P, F), rows(1, P, F), rows(0, P, F)});
  t.add({nk::OP_TS, 0, 0, nk::A_GT, 0, -1, -1, 0, -1}, {flag, cnt}, 0.0);
  t.add({nk::OP_END, 0, 0, 3}, {flag})[nk::kWholeWord] = 1;
  return nk::Program(t.words, t.imms, {{nk::F32, P * F, -1}, {nk::F32, P * F, -1}, {nk::F32, 1, 0}, {nk::F32, 1, 64}},
                     128, "loop");
}

TEST(NkiExecutor, DeviceLoopRecords) {
  const int64_t P = 128, F = 24;
  auto x = input(P * F);
  for (int threads : {1, 2}) {
    for (int n : {0, 1, 5}) {
      auto prog = counting_loop(P, F, n, 5);
      EXPECT_TRUE(prog.has_loops());
      std::vector<float> out(P * F, -7.0f);
      nk::execute(prog, {x.data(), out.data()}, threads);
      for (int64_t i = 0; i < P * F; ++i) {
        float ref = x[i];
        for (int k = 0; k < n; ++k) ref += x[i];
        ASSERT_EQ(out[i], ref) << i << ", n " << n << ", " << threads << " threads";
      }
    }
    // One iteration past the cap is the interpreter's error.
    auto capped = counting_loop(P, F, 5, 4);
    std::vector<float> out(P * F);
    try {
      nk::execute(capped, {x.data(), out.data()}, threads);
      ADD_FAILURE() << "no iteration-cap error";
    } catch (const neuronrt::Error& e) {
      EXPECT_STREQ(e.what(), "nki.language.while_loop: more than 4 iterations");
    }
  }
}

TEST(NkiExecutor, RejectsMalformedLoops) {
  const ViewSpec flag{0, 0, {1, 1}, {1, 1}};
  auto build = [&](std::vector<std::vector<int64_t>> headers, int whole = 1) {
    Table t;
    for (auto& h : headers) t.add(h, {flag})[nk::kWholeWord] = nk::is_control(h[0]) ? whole : 0;
    return nk::Program(t.words, t.imms, {{nk::F32, 1, -1}}, 0, "bad loop");
  };
  auto throws = [&](auto make, const char* what) {
    try {
      make();
      ADD_FAILURE() << "accepted: " << what;
    } catch (const neuronrt::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  build({{nk::OP_WHILE, 0, 0, 1, 3}, {nk::OP_END, 0, 0, 0}});  // an empty body is fine
  throws([&] { build({{nk::OP_WHILE, 0, 0, 1, 3}, {nk::OP_END, 0, 0, 0}}, 0); }, "must run whole");
  throws([&] { build({{nk::OP_WHILE, 0, 0, 1, 3}, {nk::OP_FILL}}); }, "names no matching OP_END");
  throws([&] { build({{nk::OP_END, 0, 0, 0}}); }, "names no matching OP_WHILE");
  throws([&] { build({{nk::OP_WHILE, 0, 0, 2, 3}, {nk::OP_WHILE, 0, 0, 3, 3}, {nk::OP_END, 0, 0, 0},
                      {nk::OP_END, 0, 0, 1}}); }, "loops do not nest");
}
