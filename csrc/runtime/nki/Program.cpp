#include "Program.h"

#include <algorithm>

#include "csrc/runtime/Error.h"

namespace neuronrt::nki {
namespace {

View parse_view(const int64_t* w) {
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

int64_t free_numel(const View& v) {
  int64_t n = 1;
  for (int i = 1; i < v.ndim; ++i) n *= v.shape[i];
  return n;
}

// Views each opcode reads or writes unconditionally (slot 0 is dst).
int fixed_views(int64_t opcode) {
  switch (opcode) {
    case OP_FILL: case OP_IOTA: case OP_WHILE: case OP_END: return 1;
    case OP_TT: case OP_STT: case OP_MM: case OP_SCAN: return 3;
    case OP_NOP: return 0;
    default: return 2;
  }
}

}  // namespace

Program::Program(std::vector<int64_t> words, std::vector<double> imms, std::vector<Buffer> buffers,
                 int64_t arena_bytes, std::string name)
    : words_(std::move(words)), imms_(std::move(imms)), buffers_(std::move(buffers)),
      arena_bytes_(arena_bytes), name_(std::move(name)) {
  if (words_.size() % kRecord != 0) {
    throw Error("nki program '" + name_ + "': " + std::to_string(words_.size()) +
                " words is not a whole number of " + std::to_string(kRecord) + "-word records");
  }
  ninstr_ = int64_t(words_.size() / kRecord);
  if (imms_.size() != size_t(2 * ninstr_)) {
    throw Error("nki program '" + name_ + "': expected 2 immediates per record (" + std::to_string(2 * ninstr_) +
                "), got " + std::to_string(imms_.size()));
  }
  if (arena_bytes_ < 0) throw Error("nki program '" + name_ + "': negative arena size");
  for (size_t b = 0; b < buffers_.size(); ++b) {
    const Buffer& buf = buffers_[b];
    const std::string what = "nki program '" + name_ + "': buffer " + std::to_string(b);
    if (buf.dtype < 0 || buf.dtype >= kNumDTypes) throw Error(what + " has unknown dtype code " + std::to_string(buf.dtype));
    if (buf.numel < 0) throw Error(what + " has a negative size");
    dtypes_.push_back(buf.dtype);
    streamed_.push_back(buf.arena_offset < 0 && buf.numel * itemsize(buf.dtype) >= kStreamBytes);
    if (buf.arena_offset < 0) {
      bound_.push_back(int64_t(b));
    } else if (buf.arena_offset % itemsize(buf.dtype) != 0 ||
               buf.arena_offset + buf.numel * itemsize(buf.dtype) > arena_bytes_) {
      throw Error(what + " does not fit in the arena at byte " + std::to_string(buf.arena_offset));
    }
  }
  views_.resize(size_t(ninstr_) * kMaxViews);
  written_.assign(buffers_.size(), false);
  std::vector<int64_t> open_loops;  // OP_WHILE records whose OP_END is still ahead
  for (int64_t i = 0; i < ninstr_; ++i) {
    for (int k = 0; k < kMaxViews; ++k) views_[i * kMaxViews + k] = parse_view(record(i) + kHeader + k * kViewWords);
    check_record(i);
    if (view(i, 0).ndim > 0) written_[view(i, 0).buf] = true;
    if (record(i)[0] == OP_ACT && record(i)[8] >= 0) written_[view(i, record(i)[8]).buf] = true;
    for (int k = 0; k < kMaxViews; ++k)
      if (view(i, k).ndim > 0) max_free_ = std::max(max_free_, free_numel(view(i, k)));
    // Loops nest: an OP_END closes the innermost open loop.
    if (record(i)[0] == OP_WHILE) {
      open_loops.push_back(i);
      has_loops_ = true;
    }
    if (record(i)[0] == OP_END) {
      if (open_loops.empty() || open_loops.back() != record(i)[3])
        throw Error("nki program '" + name_ + "': record " + std::to_string(i) + ": loops do not nest");
      open_loops.pop_back();
    }
  }
}

void Program::check_control(int64_t i) const {
  const int64_t* w = record(i);
  auto fail = [&](const std::string& msg) {
    throw Error("nki program '" + name_ + "': record " + std::to_string(i) + ": " + msg);
  };
  if (w[kWholeWord] != 1) fail("a loop record must run whole");
  const View& cond = view(i, 0);
  for (int d = 0; d < cond.ndim; ++d)
    if (cond.shape[d] == 0) fail("the loop condition is empty");
  const int64_t partner = w[3];
  const int64_t want = w[0] == OP_WHILE ? OP_END : OP_WHILE;
  const bool ahead = w[0] == OP_WHILE;
  if ((ahead ? partner <= i || partner >= ninstr_ : partner < 0 || partner >= i) || record(partner)[0] != want ||
      record(partner)[3] != i)
    fail(std::string(ahead ? "OP_WHILE" : "OP_END") + " names no matching " + (ahead ? "OP_END" : "OP_WHILE"));
}

void Program::check_record(int64_t i) const {
  const int64_t* w = record(i);
  const std::string where = "nki program '" + name_ + "': record " + std::to_string(i);
  auto fail = [&](const std::string& msg) { throw Error(where + ": " + msg); };
  const int64_t opcode = w[0];
  if ((opcode < 0 || opcode >= kNumOpcodes) && !is_control(opcode)) fail("unknown opcode " + std::to_string(opcode));
  for (int k : {kWholeWord, kBarrierWord, kGroupWord})
    if (w[k] != 0 && w[k] != 1) fail("schedule word " + std::to_string(k) + " is not 0 or 1");
  // Every present view lies inside its buffer.
  for (int k = 0; k < kMaxViews; ++k) {
    const View& v = view(i, k);
    if (v.ndim == 0) continue;
    const std::string vw = "view " + std::to_string(k);
    if (v.ndim < 0 || v.ndim > kMaxDims) fail(vw + " has " + std::to_string(v.ndim) + " dims");
    if (v.buf < 0 || v.buf >= int64_t(buffers_.size())) fail(vw + " names no buffer (" + std::to_string(v.buf) + ")");
    int64_t last = v.offset;
    bool empty = false;
    for (int d = 0; d < v.ndim; ++d) {
      if (v.shape[d] < 0 || v.stride[d] < 0) fail(vw + " has a negative size or stride");
      if (v.shape[d] == 0) empty = true;
      else last += (v.shape[d] - 1) * v.stride[d];
    }
    if (!empty && (v.offset < 0 || last >= buffers_[v.buf].numel)) {
      fail(vw + " spans elements [" + std::to_string(v.offset) + ", " + std::to_string(last) + "] of buffer " +
           std::to_string(v.buf) + " of " + std::to_string(buffers_[v.buf].numel));
    }
  }
  if (opcode == OP_NOP) return;
  for (int k = 0; k < fixed_views(opcode); ++k)
    if (view(i, k).ndim == 0) fail("view " + std::to_string(k) + " is missing");
  if (is_control(opcode)) return check_control(i);
  const bool whole = w[kWholeWord] != 0;
  const View& dst = view(i, 0);
  if (opcode == OP_FILL) {
    if (!whole && dst.shape[0] > kPartitions) fail("a partition-wise fill of more than 128 partitions");
    return;
  }
  if (opcode == OP_IOTA) {
    // w[3] pattern terms; w[4..8) their counts; w[8..12) their steps (double bits).
    if (dst.shape[0] > kPartitions) fail("iota of more than 128 partitions");
    if (w[3] < 1 || w[3] > 4) fail("iota takes 1 to 4 pattern terms");
    int64_t count = 1;
    for (int k = 0; k < w[3]; ++k) {
      if (w[4 + k] < 1) fail("iota pattern count below 1");
      count *= w[4 + k];
    }
    if (count != free_numel(dst)) fail("iota pattern does not cover dst's free elements");
    return;
  }
  const View& data = view(i, 1);
  if (opcode == OP_MM) {
    const View& mv = view(i, 2);
    const int64_t K = data.shape[0], M = free_numel(data);
    // Split by rows (each thread its rows of dst, from their stationary
    // columns): only if no thread writes what another reads.
    if (!whole && (dst.buf == data.buf || dst.buf == mv.buf)) fail("a split matmul writes a buffer it reads");
    if (w[3] != 0 && w[3] != 1) fail("matmul accumulate flag is not 0 or 1");
    if (K > kPartitions || M > kPartitions || mv.shape[0] != K || dst.shape[0] != M ||
        free_numel(dst) != free_numel(mv))
      fail("matmul shapes do not match: stationary [K, M], moving [K, N], dst [M, N] with K, M <= 128");
    return;
  }
  if (opcode == OP_PRED) {
    // w[3] op (add, multiply, maximum, minimum)
    if (!whole) fail("a partition reduction must run whole");
    if (w[3] != A_ADD && w[3] != A_MUL && w[3] != A_MAX && w[3] != A_MIN) fail("partition reduction of an unsupported op");
    if (dst.shape[0] != 1 || free_numel(dst) != free_numel(data)) fail("a partition reduction's dst is not [1, F]");
    return;
  }
  if (opcode == OP_RAND) {
    // w[3] mode, w[4] subsequence, w[5] 1 when view 2 (data) is present, w[6] slot of a rate tile
    // (-1: imm[0], imm[1]); view 1: the key, two uint32.
    if (w[3] < 0 || w[3] > 2) fail("unknown random mode " + std::to_string(w[3]));
    if (w[4] < 0) fail("negative Philox subsequence");
    if (dtypes_[data.buf] != U32 || data.ndim != 2 || data.shape[0] != 1 || data.shape[1] != 2)
      fail("the Philox key is not a [1, 2] uint32 view");
    if (dst.shape[0] > kPartitions) fail("random values for more than 128 partitions");
    if ((w[5] != 0) != (w[3] != 0)) fail("dropout needs data (view 2), rand none");
    if (w[5] && (view(i, 2).ndim == 0 || view(i, 2).shape[0] != dst.shape[0] ||
                 free_numel(view(i, 2)) != free_numel(dst)))
      fail("dropout data does not match dst");
    if (w[6] != -1 && (w[3] == 0 || w[6] < 2 || w[6] >= kMaxViews || view(i, w[6]).ndim == 0))
      fail("the dropout rate slot names no view");
    return;
  }
  if (opcode == OP_COPY) {
    int64_t a = 1, b = 1;
    for (int d = 0; d < dst.ndim; ++d) a *= dst.shape[d];
    for (int d = 0; d < data.ndim; ++d) b *= data.shape[d];
    if (a != b) fail("copy of " + std::to_string(b) + " elements into " + std::to_string(a));
    if (!whole && (dst.shape[0] > kPartitions || data.shape[0] != dst.shape[0] ||
                   free_numel(dst) != free_numel(data)))
      fail("a partition-wise copy between different partition layouts");
    return;
  }
  // Partition-wise instructions: dst and data share the partitions.
  const int64_t P = data.shape[0], n = free_numel(data), dn = free_numel(dst);
  if (P > kPartitions || dst.shape[0] != P) fail("dst and data do not share <= 128 partitions");
  auto alu = [&](int64_t op, bool optional) {
    if (!(optional && op == -1) && (op < 0 || op >= kNumAlu)) fail("unknown ALU op " + std::to_string(op));
  };
  auto operand = [&](int64_t slot, bool optional_none) {
    // -1: an immediate; -2 (bias only): none; else a [P, 1] or [1, 1] tile.
    if (slot == -1 || (optional_none && slot == -2)) return;
    if (slot < fixed_views(opcode) || slot >= kMaxViews || view(i, slot).ndim == 0)
      fail("operand slot " + std::to_string(slot) + " names no operand view");
    const View& v = view(i, slot);
    if (free_numel(v) != 1 || (v.shape[0] != 1 && v.shape[0] != P)) fail("a per-partition operand is not [P, 1]");
  };
  auto same_rows = [&](const View& v) {
    if (v.shape[0] != P || free_numel(v) != n) fail("elementwise operands of different shapes");
  };
  switch (opcode) {
    case OP_TT:
      alu(w[3], false);
      same_rows(view(i, 2));
      break;
    case OP_TS:
      alu(w[3], false);
      operand(w[5], false);
      alu(w[6], true);
      if (w[6] != -1) operand(w[8], false);
      break;
    case OP_STT:
      alu(w[3], false);
      alu(w[6], false);
      operand(w[5], false);
      same_rows(view(i, 2));
      // w[8]: an activation applied to data first (-1: none)
      if (w[8] < -1 || w[8] >= kNumFn) fail("unknown activation function " + std::to_string(w[8]));
      break;
    case OP_ACT: {
      if (w[3] < 0 || w[3] >= kNumFn) fail("unknown activation function " + std::to_string(w[3]));
      if (w[7] != 0 && w[7] != 2 && w[7] != 3 && w[7] != 4) fail("unknown reduce command " + std::to_string(w[7]));
      if (w[9] != 0 && w[9] != 1) fail("unknown engine " + std::to_string(w[9]));
      operand(w[5], false);
      operand(w[6], true);
      if (w[8] != -1) {
        if (w[8] < 2 || w[8] >= kMaxViews || view(i, w[8]).ndim == 0) fail("reduce_res slot names no view");
        const View& r = view(i, w[8]);
        if (r.shape[0] != P || free_numel(r) != 1) fail("reduce_res is not [P, 1]");
      }
      break;
    }
    case OP_SEL:
      // w[3], w[4]: slots of x and y (-1: the immediates).
      for (int k : {3, 4}) {
        if (w[k] == -1) continue;
        if (w[k] < 2 || w[k] >= kMaxViews || view(i, w[k]).ndim == 0) fail("select operand slot names no view");
        same_rows(view(i, w[k]));
      }
      break;
    case OP_SCAN:
      // w[3] op0, w[4] reverse0, w[5] op1, w[6] reverse1, w[7] slot of the initial value (-1: imm[0]).
      alu(w[3], false);
      alu(w[5], false);
      operand(w[7], false);
      same_rows(view(i, 2));
      break;
    case OP_REG:
      // w[3] cmd (2 reduce, 3 reset_reduce, 4 reset, 5 load_reduce), w[4] op, w[5] engine,
      // w[6] writes reduce_res (view 0), w[7] negates it, w[8] slot of load_reduce's base (-1: imm[0]).
      if (w[3] < 2 || w[3] > 5) fail("unknown register command " + std::to_string(w[3]));
      if (w[4] != A_ADD && w[4] != A_MAX && w[4] != A_MIN) fail("register reduction of an unsupported op");
      if (w[5] != 0 && w[5] != 1) fail("unknown engine " + std::to_string(w[5]));
      if ((w[6] != 0 && w[6] != 1) || (w[7] != 0 && w[7] != 1)) fail("register flags are not 0 or 1");
      operand(w[8], false);
      if (n != 1) fail("the register reduction is not [P, 1]");
      break;
    case OP_BITS: {
      // w[3] form (0 tensor_tensor, 1 tensor_scalar, 2 reduce), w[4] op0, w[5] reverse0, w[6] slot0
      // (-1: imm[0]), w[7] op1 (-1: none), w[8] reverse1, w[9] slot1, w[10] elements per reduction.
      for (int k = 0; k < kMaxViews; ++k)
        if (view(i, k).ndim > 0 && !is_integral(dtypes_[view(i, k).buf])) fail("a bitvector op on a non-integer buffer");
      auto bop = [&](int64_t op) { if (op < 0 || op >= kNumBitOps) fail("unknown bitvector op " + std::to_string(op)); };
      bop(w[4]);
      if (w[3] == 0) {
        same_rows(view(i, 2));
      } else if (w[3] == 1) {
        operand(w[6], false);
        if (w[7] != -1) {
          bop(w[7]);
          operand(w[9], false);
        }
      } else if (w[3] == 2) {
        if (w[4] != B_AND && w[4] != B_OR) fail("a bitvector reduction other than and/or");
        if (w[10] < 1 || n % w[10] != 0 || dn != n / w[10]) fail("reduction groups do not divide the row");
        return;
      } else {
        fail("unknown bitvector form " + std::to_string(w[3]));
      }
      break;
    }
    case OP_TOPK:
      // w[3] 0: max8 (dst [P, 8] of data [P, n >= 8]); 1: find_index8 (view 2: vals [P, 8]).
      if (w[3] != 0 && w[3] != 1) fail("unknown top-8 mode " + std::to_string(w[3]));
      if (dn != 8 || n < 8 || n > 16384) fail("top-8 shapes: dst [P, 8], data [P, 8..16384]");
      if (w[3] == 1 && (view(i, 2).ndim == 0 || view(i, 2).shape[0] != P || free_numel(view(i, 2)) != 8))
        fail("find_index8 needs vals [P, 8]");
      return;
    case OP_VAR:
      if (w[3] < 1 || n % w[3] != 0 || dn != n / w[3]) fail("variance groups do not divide the row");
      return;
    case OP_TRED:
      if (w[3] != A_ADD && w[3] != A_MUL && w[3] != A_MAX && w[3] != A_MIN) fail("tensor_reduce of an unsupported op");
      if (w[4] < 1 || n % w[4] != 0 || dn != n / w[4]) fail("tensor_reduce groups do not divide the row");
      return;
  }
  if (dn != n) fail("dst has " + std::to_string(dn) + " elements per partition, data " + std::to_string(n));
}

}  // namespace neuronrt::nki
