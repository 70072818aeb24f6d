#include "Executor.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "Kernels.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include "csrc/runtime/Error.h"

namespace neuronrt::nki {
namespace {

using detail::Ctx;
using detail::DecodeRecord;
using detail::Prefetch;
using detail::RowOp;
using detail::RunRecord;
using detail::RunRows;
using detail::Scratch;

// The widest build the CPU runs. NKI_KERNEL_ISA=generic|avx2|avx512 forces
// one (tests compare the builds; an unsupported choice is an error there).
struct Kernels {
  RunRecord run;
  DecodeRecord decode;
  RunRows rows;
};
Kernels pick_kernels() {
  constexpr Kernels generic{detail::generic::run_record, detail::generic::decode_record, detail::generic::run_rows};
  constexpr Kernels avx2{detail::avx2::run_record, detail::avx2::decode_record, detail::avx2::run_rows};
  constexpr Kernels avx512{detail::avx512::run_record, detail::avx512::decode_record, detail::avx512::run_rows};
  if (const char* isa = std::getenv("NKI_KERNEL_ISA")) {
    const std::string v = isa;
    if (v == "generic") return generic;
    if (v == "avx2") return avx2;
    if (v == "avx512") return avx512;
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("f16c") &&
      __builtin_cpu_supports("fma"))
    return avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma"))
    return avx2;
#endif
  return generic;
}

const Kernels kernels = pick_kernels();
const RunRecord run_record = kernels.run;

// Worker threads for the partition ranges, created on first use and kept.
// A launch's nt ranges are claimed, each by the first thread to reach it (the
// caller included, which keeps claiming until none is left), so a worker that
// its core's other jobs keep from running costs no wait: the caller runs its
// range (a split attention head with the second core busy waited for the
// worker's half).
// A thread claims a new range only after finishing its last, and a range
// waiting at a barrier waits for ranges other threads hold, so barriers still
// meet. One program runs at a time. Workers and the caller spin briefly
// before they sleep (as OpenMP's threads do), so back-to-back launches do not
// pay a wake-up each. A forked child gets a fresh pool (the parent's threads
// do not exist there).
class Pool {
 public:
  void run(int nt, const std::function<void(int)>& fn) {
    std::lock_guard<std::mutex> one(run_mutex_);
    uint64_t gen;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      while (int(workers_.size()) < nt - 1) {
        workers_.emplace_back([this, seen = generation_.load()] { work(seen); });
        workers_.back().detach();
      }
      job_ = &fn;
      done_.store(0);
      gen = generation_.load() + 1;
      claim_.store(gen << 32 | uint64_t(nt) << 16);  // (generation, ranges, next range)
      generation_.store(gen, std::memory_order_release);  // publishes job_
    }
    wake_.notify_all();
    claim_ranges(gen);
    if (!spin([&] { return done_.load(std::memory_order_acquire) == nt; })) {
      std::unique_lock<std::mutex> lock(mutex_);
      finished_.wait(lock, [&] { return done_.load(std::memory_order_acquire) == nt; });
    }
    job_ = nullptr;
  }

 private:
  // About 0.3 ms of waiting before sleeping: pauses first, then yields, so
  // a thread the caller waits for that shares its core (a loaded host) runs
  // at once. With pauses only, attention 512x64 bf16 with both threads on
  // one core took 1.03 ms a call against 0.49 on one thread.
  template <typename Ready>
  static bool spin(Ready ready) {
    for (int i = 0; i < 128; ++i) {
      if (ready()) return true;
#if defined(__x86_64__)
      _mm_pause();
#endif
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(300);
    while (!ready()) {
      if (std::chrono::steady_clock::now() > until) return false;
      sched_yield();
    }
    return true;
  }

  // Runs the ranges of launch `gen` that no thread has claimed yet. A range
  // claimed in `gen` keeps its launch (and job_) alive until it is done.
  void claim_ranges(uint64_t gen) {
    for (;;) {
      uint64_t c = claim_.load(std::memory_order_acquire);
      const uint64_t next = c & 0xFFFF, nt = c >> 16 & 0xFFFF;
      if ((c >> 32) != (gen & 0xFFFFFFFFu) || next >= nt) return;
      if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
      (*job_)(int(next));
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == int(nt)) {
        std::lock_guard<std::mutex> lock(mutex_);
        finished_.notify_one();
      }
    }
  }

  // `seen`: the generation before the worker's first job.
  void work(uint64_t seen) {
    for (;;) {
      auto fresh = [&] { return generation_.load(std::memory_order_acquire) != seen; };
      if (!spin(fresh)) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, fresh);
      }
      seen = generation_.load(std::memory_order_acquire);
      claim_ranges(seen);
    }
  }

  std::mutex run_mutex_, mutex_;
  std::condition_variable wake_, finished_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<int> done_{0};          // ranges of the current launch finished
  std::atomic<uint64_t> claim_{0};    // generation << 32 | ranges << 16 | next range
  std::atomic<uint64_t> generation_{0};
};

Pool& pool() {
  static std::atomic<Pool*> current{nullptr};
  static std::atomic<pid_t> owner{0};
  static std::mutex mutex;
  const pid_t pid = getpid();
  Pool* p = current.load();
  if (p && owner.load() == pid) return *p;
  std::lock_guard<std::mutex> lock(mutex);
  if (!current.load() || owner.load() != pid) {
    current.store(new Pool());  // a pool inherited through fork() is leaked, not destroyed
    owner.store(pid);
  }
  return *current.load();
}

// On-chip tiles and private HBM of the calling thread's launches: reused, so
// its pages are faulted in once.
char* arena(int64_t bytes) {
  struct Arena {
    char* data = nullptr;
    int64_t size = 0;
    ~Arena() { std::free(data); }
  };
  thread_local Arena a;
  if (a.size < bytes) {
    std::free(a.data);
    a.size = (bytes + 63) / 64 * 64;
    a.data = static_cast<char*>(std::aligned_alloc(64, a.size));
    if (!a.data) throw Error("nki executor: cannot allocate a " + format_bytes(size_t(a.size)) + " arena");
  }
  return a.data;
}

const char* intern(const std::string& name) {
  static std::mutex mutex;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return names.insert("nki::" + name).first->c_str();
}

// What a stretch of records [i, j) streams and reads from HBM per partition
// row, worked out once per stretch (its records, views and buffers are the
// same for every block of rows): a step of one row then costs a few adds
// instead of a walk over every record's views.
struct StretchPlan {
  struct Out {
    int64_t rows, bytes;  // partitions [0, rows) stream `bytes` each
  };
  std::vector<Out> outs;
  std::vector<RowOp> ops;  // the records, decoded
  std::vector<const View*> fp32_reads;  // plan_stretch's scratch (capacity kept)
  Prefetch::Range ranges[Prefetch::kMaxRanges];
  int nranges = 0;
  int64_t fetch_rows = 0;          // the ranges hold rows [0, fetch_rows)
  int64_t fetch_per_row = 0;       // bytes fetched per row
  bool row_steps = false;          // one row per step (plan_stretch)
  bool one_step = false;           // all of a thread's rows in one step (a matmul)
  int64_t i = 0, j = 0;

  // Bytes the stretch stores with streaming stores on partitions [p, pe).
  int64_t streamed(int64_t p, int64_t pe) const {
    int64_t bytes = 0;
    for (const Out& o : outs) bytes += std::max<int64_t>(0, std::min(pe, o.rows) - p) * o.bytes;
    return bytes;
  }
  // Starts `pf` on rows [p, pe) of the ranges, spread over `streamed` bytes of stores.
  void prefetch(int64_t p, int64_t pe, int64_t streamed, Prefetch& pf) const {
    pf.clear();
    if (streamed <= 0 || nranges == 0) return;
    for (int q = 0; q < nranges; ++q) pf.ranges[q] = ranges[q];
    pf.nranges = nranges;
    pe = std::min(pe, fetch_rows);
    pf.start(p, pe, fetch_per_row * std::max<int64_t>(pe - p, 0), streamed);
  }
};

// Plans stretch [i, j): its records decoded (RowOp), its rows per step, its
// streamed outputs, and what it reads from HBM
// (bound buffers; on-chip tiles are in cache already) for the prefetch of
// the step before it. A view read by several records is fetched once; a
// partition-broadcast row (stride 0) stays in cache by itself, and a view
// whose rows are mostly gaps is not worth its lines.
void plan_stretch(const Ctx& c, int64_t i, int64_t j, StretchPlan& plan) {
  const Program& prog = *c.program;
  plan.outs.clear();  // keeps its capacity: plans are made per stretch run
  plan.ops.resize(size_t(j - i));
  plan.nranges = 0;
  plan.fetch_rows = kPartitions;
  plan.fetch_per_row = 0;
  plan.i = i, plan.j = j;
  // One row per step for a stretch that reads the same fp32 rows of a bound
  // buffer in two records and writes no rows but streamed ones (RMSNorm: the
  // sum of squares, then x * rstd * w): the row read again is still in L1, and
  // each row's reads alternate with its streamed writes. RMSNorm fp32 [4096,
  // 2048] at 1 thread: 2.04-2.17 ms against 2.14-2.41 ms at 128 KiB blocks,
  // 2.28-2.70 ms at two rows. Where rows go through a tile (softmax, pooling),
  // a single record reads them (SwiGLU) or bf16 rows (sums that are bound by
  // their widening) one-row steps measured 4-66 % slower.
  bool writes_rows = false;
  std::vector<const View*>& fp32_reads = plan.fp32_reads;
  fp32_reads.clear();
  int reread = 0;
  for (int64_t k = i; k < j; ++k) {
    kernels.decode(c, k, plan.ops[size_t(k - i)]);
    const int64_t* w = prog.record(k);
    if (w[0] == OP_NOP) continue;
    const View& dst = prog.view(k, 0);
    if (w[1] == 0 && dst.ndim > 1 && !prog.streamed(dst.buf)) {
      int64_t free = 1;
      for (int d = 1; d < dst.ndim; ++d) free *= dst.shape[d];
      writes_rows = writes_rows || free > 1;
    }
    if (w[0] == OP_TS || w[0] == OP_TT || w[0] == OP_STT || w[0] == OP_ACT || w[0] == OP_TRED) {
      for (int slot = 1; slot <= (w[0] == OP_TT || w[0] == OP_STT ? 2 : 1); ++slot) {
        const View& v = prog.view(k, slot);
        if (prog.buffers()[v.buf].arena_offset >= 0 || prog.dtypes()[v.buf] != F32 || v.ndim < 2 || v.stride[0] <= 0) continue;
        bool again = false;
        for (const View* u : fp32_reads) again = again || (u->buf == v.buf && u->offset == v.offset && u->stride[0] == v.stride[0]);
        if (again) ++reread;
        else fp32_reads.push_back(&v);
      }
    }
  }
  plan.row_steps = reread > 0 && !writes_rows;
  // In a row step a [P, 1] fp32 value the record before stored (a sum into
  // reduce_res, a [P, 1] tensor_scalar or activation) passes to the record
  // reading it next in a register (RowOp::forward): RMSNorm's sum, its
  // (ss / H + eps), rsqrt and the scale.
  for (size_t k = 1; plan.row_steps && k < plan.ops.size(); ++k) {
    const RowOp& prev = plan.ops[k - 1];
    RowOp& op = plan.ops[k];
    const RowOp::Elem& in = op.step == RowOp::kScalar ? op.x : op.s0;
    op.forward = (prev.step == RowOp::kSumSquares || prev.step == RowOp::kScalar) && prev.out.base &&
                 prev.out.dtype == F32 && (op.step == RowOp::kScalar || op.step == RowOp::kStt) &&
                 in.base == prev.out.base && in.stride == prev.out.stride && in.dtype == F32;
  }
  plan.one_step = j == i + 1 && prog.record(i)[0] == OP_MM;
  for (int64_t k = i; k < j; ++k) {
    const int64_t* w = prog.record(k);
    if (w[0] == OP_FILL || w[0] == OP_NOP || w[0] == OP_MM) continue;
    const View& dst = prog.view(k, 0);
    if (prog.streamed(dst.buf) && dst.run > 0) plan.outs.push_back({dst.shape[0], dst.run * itemsize(prog.dtypes()[dst.buf])});
    for (int slot = 1; slot < kMaxViews && plan.nranges < Prefetch::kMaxRanges; ++slot) {
      if (w[0] == OP_ACT && slot == w[8]) continue;  // reduce_res: written
      const View& v = prog.view(k, slot);
      if (v.ndim < 2 || prog.buffers()[v.buf].arena_offset >= 0 || v.stride[0] <= 0) continue;
      // Only rows narrower than fp32: their loops convert as they read, so the
      // fetch overlaps work. A loop over fp32 rows runs at memory speed, where
      // the hardware's stream prefetcher keeps up and lines fetched a block
      // ahead only push out the block the next record reads again (RMSNorm at
      // 1 thread without it: fp32 about 15 % less CPU time; bf16 about 40 % more).
      if (itemsize(prog.dtypes()[v.buf]) >= 4) continue;
      int64_t extent = 1, numel = 1;
      bool ok = true;
      for (int d = 1; d < v.ndim; ++d) {
        ok = ok && v.shape[d] > 0 && v.stride[d] >= 0;
        extent += (v.shape[d] - 1) * v.stride[d];
        numel *= v.shape[d];
      }
      if (!ok || extent > 2 * numel + 64) continue;
      const int64_t size = itemsize(prog.dtypes()[v.buf]);
      const Prefetch::Range r{c.bufs[v.buf] + v.offset * size, v.stride[0] * size, extent * size};
      bool seen = false;
      for (int q = 0; q < plan.nranges; ++q)
        seen = seen || (plan.ranges[q].base == r.base && plan.ranges[q].stride == r.stride && plan.ranges[q].bytes >= r.bytes);
      if (seen) continue;
      plan.ranges[plan.nranges++] = r;
      plan.fetch_rows = std::min(plan.fetch_rows, v.shape[0]);
      plan.fetch_per_row += r.bytes + 64;
    }
  }
}

// Whether the first element of record i's view 0 (a loop condition) is
// nonzero as fp32, as the interpreter reads it: integers are nonzero as
// themselves, floats when any bit but the sign is set (NaN included).
bool condition(const Ctx& c, int64_t i) {
  const View& v = c.program->view(i, 0);
  const int64_t dtype = c.dtypes[v.buf];
  const char* p = c.bufs[v.buf] + v.offset * itemsize(dtype);
  uint64_t bits = 0, magnitude = ~uint64_t(0);
  std::memcpy(&bits, p, size_t(itemsize(dtype)));  // little-endian: the element's own bits
  switch (dtype) {
    case F32: magnitude = 0x7fffffffu; break;
    case BF16: case F16: magnitude = 0x7fffu; break;
    case F8E4M3: case F8E5M2: magnitude = 0x7fu; break;
    default: break;
  }
  return (bits & magnitude) != 0;
}

// Runs control record i (Program.h OP_WHILE / OP_END) and returns the next
// record. `iterations[h]`: the iterations of the loop headed at h so far.
int64_t control(const Ctx& c, int64_t i, std::vector<int64_t>& iterations) {
  const Program& prog = *c.program;
  const int64_t* w = prog.record(i);
  const bool head = w[0] == OP_WHILE;
  if (!condition(c, i)) return head ? w[3] + 1 : i + 1;
  const int64_t h = head ? i : w[3];
  int64_t& n = iterations[h];
  n = head ? 1 : n + 1;
  const int64_t cap = prog.record(h)[4];
  if (n > cap) throw Error("nki.language.while_loop: more than " + std::to_string(cap) + " iterations");
  return h + 1;
}

// The records of thread t of nt: each thread owns a fixed range of the 128
// partitions for every record, so partition-local records need no
// synchronisation; the lowering marks where a barrier is needed
// (kBarrierWord) and which records one thread runs whole (kWholeWord).
void run_thread(Ctx& c, int t, int nt, std::barrier<>* sync_) {
  // Streaming stores are weakly ordered: fence them before other threads
  // (or, at the end, the launch's consumers) may read what they wrote.
  struct Sync {
    std::barrier<>* b;
    void arrive_and_wait() {
      fence();
      b->arrive_and_wait();
    }
    static void fence() {
#if defined(__x86_64__)
      _mm_sfence();
#endif
    }
  } sync_obj{sync_}, *sync = sync_ ? &sync_obj : nullptr;
  struct Fence {
    ~Fence() { Sync::fence(); }
  } end_fence;
  const Program& prog = *c.program;
  const int64_t lo = kPartitions * t / nt, hi = kPartitions * (t + 1) / nt;
  Scratch sc;
  sc.size(prog.max_free());
  // Rows per step of a segment: about 128 KiB of the widest row, so a step's
  // rows stay in L2 from one record to the next while DMA-like streams stay long.
  const int64_t block = std::max<int64_t>(1, (int64_t(128) << 10) / (4 * prog.max_free()));
  const int64_t ninstr = prog.size();
  std::vector<int64_t> iterations(prog.has_loops() ? ninstr : 0);
  StretchPlan here, next;  // the stretch running, and the one after it
  // The end of the stretch of split records from i: up to the next whole
  // record, barrier or loop iteration. A matmul is a stretch of its own, run
  // over all of the thread's rows in one step: its rows read the whole moving
  // operand, packed once per call (in blocks of 64 rows an attention head
  // packed its K^T twice as often, about 2 % of its time at 1 thread).
  auto stretch_end = [&](int64_t i) {
    int64_t j = i + 1;
    if (prog.record(i)[0] == OP_MM) return j;
    while (j < ninstr && prog.record(j)[kWholeWord] == 0 && prog.record(j)[kBarrierWord] == 0 &&
           prog.record(j)[kGroupWord] == 0 && prog.record(j)[0] != OP_MM)
      ++j;
    return j;
  };
  for (int64_t i = 0; i < ninstr;) {
    const int64_t* w = prog.record(i);
    if (is_control(w[0])) {  // one thread (execute), so no other thread to agree with
      sc.prefetch.clear();
      i = control(c, i, iterations);
      continue;
    }
    if (w[kWholeWord] != 0) {
      sc.prefetch.clear();
      if (sync) sync->arrive_and_wait();
      if (t == 0) run_record(c, i, 0, kPartitions, true, sc);
      if (sync) sync->arrive_and_wait();
      ++i;
      continue;
    }
    if (w[kBarrierWord] != 0 && sync) sync->arrive_and_wait();
    // A segment of partition-local records (up to the next barrier, whole
    // record or loop iteration) runs a block of partitions at a time: all of
    // its records on rows [p, p + block), then the next block, so rows stay
    // in cache from one instruction to the next (the lowering guarantees no
    // record reads what another writes in a different partition, or HBM
    // another writes).
    const int64_t j = stretch_end(i);
    // The step after a stretch's last block is the first block of the next
    // stretch (the next loop iteration), unless that one runs whole or waits
    // for other threads' writes at a barrier.
    const bool ahead = j < ninstr && prog.record(j)[kWholeWord] == 0 && (!sync || prog.record(j)[kBarrierWord] == 0);
    // A loop's iterations are stretches of the same shape: the plan made as
    // the next stretch is this one's when the loop comes round.
    if (next.i == i && next.j == j) std::swap(here, next);
    else plan_stretch(c, i, j, here);
    if (ahead) plan_stretch(c, j, stretch_end(j), next);
    else next.i = next.j = 0;  // no stretch is [0, 0)
    const int64_t step = here.one_step ? hi - lo : here.row_steps ? 1 : block;
    const int64_t nops = int64_t(here.ops.size());
    if (here.row_steps && here.nranges == 0 && !(ahead && next.nranges > 0)) {
      // Nothing to prefetch on the way: all of the thread's rows in one call.
      sc.prefetch.clear();
      kernels.rows(c, here.ops.data(), nops, lo, hi, sc);
      i = j;
      continue;
    }
    for (int64_t p = lo; p < hi; p += step) {
      const int64_t pe = std::min(p + step, hi);
      const int64_t out = here.streamed(p, pe);
      if (pe < hi) here.prefetch(pe, std::min(pe + step, hi), out, sc.prefetch);
      else if (ahead) next.prefetch(lo, std::min(lo + (next.one_step ? hi - lo : next.row_steps ? 1 : block), hi), out, sc.prefetch);
      else sc.prefetch.clear();
      if (here.row_steps) kernels.rows(c, here.ops.data(), nops, p, pe, sc);
      else
        for (const RowOp& op : here.ops) op.run(c, op, p, pe, sc);
    }
    i = j;
  }
}

// Fewer threads for a small program: waking the pool and the barriers cost
// more than they save (~1 ms at 2 threads for a 128x64 attention head). A
// thread whose partition range starts past every partition-local record's
// partitions would only wait at barriers (a [1, 576] RMSNorm touches one), and
// under kSmallBytes of bound data per thread the rows are too few to share.
// NKI_SPLIT_SMALL=1 keeps every thread (tests of the threaded paths).
int useful_threads(const Program& prog, const std::vector<std::pair<char*, char*>>& spans, int nt) {
  if (const char* e = std::getenv("NKI_SPLIT_SMALL"); e && e[0] == '1') return nt;
  constexpr int64_t kSmallBytes = int64_t(128) << 10;
  int64_t bytes = 0;
  for (const auto& s : spans) bytes += s.second - s.first;
  while (nt > 1 && bytes < kSmallBytes * nt) --nt;
  // Each whole record and barrier is a meeting of all threads (two for a whole
  // record): a program meeting more often than every kSmallBytes of its data
  // runs on one thread. (Attention 512x64 at 2 threads took 1.5-8x its time at
  // 1 when its matmuls and transposes ran whole; split, a head meets once.)
  int64_t meetings = 0;
  for (int64_t i = 0; i < prog.size(); ++i)
    meetings += prog.record(i)[kWholeWord] != 0 ? 2 : prog.record(i)[kBarrierWord] != 0 ? 1 : 0;
  if (nt > 1 && meetings * kSmallBytes > bytes) nt = 1;
  int64_t parts = 0;
  for (int64_t i = 0; i < prog.size() && nt > 1; ++i) {
    if (prog.record(i)[kWholeWord] != 0) continue;  // runs on thread 0 anyway
    for (int slot = 0; slot < kMaxViews; ++slot)
      if (prog.view(i, slot).ndim > 0) parts = std::max(parts, prog.view(i, slot).shape[0]);
  }
  while (nt > 1 && kPartitions * (nt - 1) / nt >= parts) --nt;
  return nt;
}

}  // namespace

const char* kernel_isa() noexcept {
  return run_record == detail::avx512::run_record ? "avx512" : run_record == detail::avx2::run_record ? "avx2" : "generic";
}

void execute(const Program& program, const std::vector<void*>& bound, int threads) {
  const auto& ids = program.bound();
  if (bound.size() != ids.size()) {
    throw Error("nki program '" + program.name() + "': expected " + std::to_string(ids.size()) +
                " bound buffers, got " + std::to_string(bound.size()));
  }
  const auto& buffers = program.buffers();
  std::vector<char*> bufs(buffers.size(), nullptr);
  char* base = arena(std::max<int64_t>(program.arena_bytes(), 64));
  for (size_t b = 0; b < buffers.size(); ++b)
    if (buffers[b].arena_offset >= 0) bufs[b] = base + buffers[b].arena_offset;
  std::vector<std::pair<char*, char*>> spans;
  for (size_t k = 0; k < ids.size(); ++k) {
    const Buffer& buf = buffers[ids[k]];
    char* p = static_cast<char*>(bound[k]);
    if (!p && buf.numel > 0) throw Error("nki program '" + program.name() + "': bound buffer " + std::to_string(ids[k]) + " is null");
    bufs[ids[k]] = p;
    spans.emplace_back(p, p + buf.numel * itemsize(buf.dtype));
  }
  std::sort(spans.begin(), spans.end());
  int nt = std::clamp(threads, 1, kPartitions);
  bool aliased = false;
  for (size_t k = 1; k < spans.size(); ++k) aliased = aliased || spans[k - 1].second > spans[k].first;
  if (aliased) nt = 1;
  nt = useful_threads(program, spans, nt);
  // A device loop runs on one thread. Its condition is one element that the
  // body rewrites, so threads would agree on it only with two barriers per
  // iteration (read after the writes, rewrite after every read), and the
  // iteration-cap error would have to stop every worker; loop bodies are
  // small tiles ([1, 1] state), where a meeting costs more than it saves.
  if (program.has_loops()) nt = 1;

  Ctx c;
  c.program = &program;
  c.bufs = bufs.data();
  c.dtypes = program.dtypes();
  static std::atomic<uint64_t> launches{0};
  c.launch = ++launches;
  c.aliased = aliased;
  std::memset(c.regs, 0, sizeof(c.regs));
  if (nt == 1) {
    run_thread(c, 0, 1, nullptr);
    return;
  }
  std::barrier<> sync(nt);
  pool().run(nt, [&](int t) { run_thread(c, t, nt, &sync); });
}

ProgramKernel::ProgramKernel(std::shared_ptr<const Program> program, std::vector<void*> bound, int threads)
    : program_(std::move(program)), bound_(std::move(bound)), threads_(threads), name_(intern(program_->name())) {}

}  // namespace neuronrt::nki
