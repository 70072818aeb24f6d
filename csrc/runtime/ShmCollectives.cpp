// The shared-memory collectives (ShmCollectives.h). One file on purpose,
// over 600 lines: the segment, the step protocol (begin_step/meet/arrive),
// the single-copy path and the collectives that drive them share private
// state and an ordering argument that is easier to check in one place; the
// reduction kernels (shm/) and peer mappings (PeerMemory) are separate.
#include "ShmCollectives.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>
#include <type_traits>

#include "ShmReduce.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace neuronrt {

// ---- segment layout ------------------------------------------------------------
// [header page][size x control page][size x data slot]. A control page holds
// the rank's Control, two halves of exchange() words and two halves of
// Offer (where the rank's buffers of a single-copy step live). The header
// page also holds the single-copy steps' shared work counters.

namespace {

constexpr uint64_t kMagic = 0x314d48535852544eull;  // "NTRXSHM1"
constexpr size_t kPage = 4096;
// Longest deadline honoured (larger timeouts would overflow the clock).
constexpr std::chrono::milliseconds kMaxTimeout{std::chrono::hours(24 * 365)};

struct Header {
  uint64_t magic;
  uint64_t size;
  uint64_t slot_bytes;
};

// Work items of the single-copy steps, shared by all ranks (header page,
// own cache lines). Both only grow, modulo 2^32; every rank knows each
// step's base (the ranks run the same steps).
struct WorkCounters {
  alignas(64) std::atomic<uint32_t> claimed;  // items handed out
  alignas(64) std::atomic<uint32_t> done;     // items finished
  std::atomic<uint32_t> sleepers;             // waiters blocked in a futex on done
};
static_assert(64 + sizeof(WorkCounters) <= kPage);

size_t segment_bytes(int size, size_t slot_bytes) {
  return kPage + static_cast<size_t>(size) * (kPage + slot_bytes);
}

uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Process-shared futex on a 32-bit word of the segment.
void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, std::chrono::microseconds timeout) {
  struct timespec ts {};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000000) * 1000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

// ---- moving bytes -------------------------------------------------------------------
// Large single-copy collectives stream their results out with non-temporal
// stores: the destination lines are not read for ownership first (a third of
// a normal copy's memory traffic), and the ranks share the memory bus.
// Collectives whose buffers (all ranks' together) exceed a last-level cache
// slice stream their results: they would not stay in the cache anyway.
// Smaller ones keep normal stores, which leave the results in the cache.
// (A fixed size: in a VM, sysconf reports the whole host's L3.)
constexpr size_t kCacheBytes = size_t{32} << 20;
bool streams(size_t bytes_all_ranks) { return bytes_all_ranks > kCacheBytes; }
// A work item of the single-copy path: large enough to amortize claiming
// it, small enough that a rank the scheduler left out holds up little.
constexpr size_t kItemBytes = size_t{256} << 10;

using shm::copy_bytes;
using shm::copy_to_all;
using shm::reduce;
using shm::store_fence;

bool is_floating(ShmDtype d) {
  return d == ShmDtype::Float32 || d == ShmDtype::Float64 || d == ShmDtype::Float16 || d == ShmDtype::BFloat16;
}

// Elements per rank's portion of a step of `count` elements: whole cache
// lines, so two ranks never write the same line.
size_t portion(size_t count, int n, size_t esize) {
  const size_t line = std::max<size_t>(1, 64 / esize);
  const size_t per = (count + static_cast<size_t>(n) - 1) / static_cast<size_t>(n);
  return (per + line - 1) / line * line;
}

}  // namespace

size_t shm_dtype_size(ShmDtype dtype) noexcept {
  switch (dtype) {
    case ShmDtype::Float64: case ShmDtype::Int64: return 8;
    case ShmDtype::Float32: case ShmDtype::Int32: return 4;
    case ShmDtype::Float16: case ShmDtype::BFloat16: case ShmDtype::Int16: return 2;
    case ShmDtype::Int8: case ShmDtype::UInt8: return 1;
  }
  return 1;
}

bool shm_supports(ShmDtype dtype, ShmReduceOp op) noexcept {
  return op != ShmReduceOp::Avg || is_floating(dtype);
}

// ---- the group ------------------------------------------------------------------------

struct ShmCollectives::Control {
  alignas(64) std::atomic<uint32_t> seq;  // arrivals so far (two per step)
  std::atomic<uint32_t> sleepers;  // waiters blocked in a futex on seq
  std::atomic<uint32_t> aborted;  // this rank failed or aborted: stop waiting for it
  int32_t pid;
  uint64_t pidns;
};
static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free);

ShmCollectives::ShmCollectives(std::string name, int rank, int size, void* base, size_t bytes, size_t slot_bytes)
    : name_(std::move(name)), rank_(rank), size_(size), base_(base), bytes_(bytes), slot_bytes_(slot_bytes) {
  static_assert(sizeof(Control) <= 128 && 128 + 2 * kExchangeWords * sizeof(int64_t) + 2 * sizeof(Offer) <= kPage);
  static_assert(std::is_trivially_copyable_v<SharedBuffer>);
  pidns_ = pid_namespace();
  Control& me = control(rank_);
  me.pid = static_cast<int32_t>(::getpid());
  me.pidns = pidns_;
}

ShmCollectives::~ShmCollectives() {
  if (base_) ::munmap(base_, bytes_);
}

std::unique_ptr<ShmCollectives> ShmCollectives::create(int rank, int size, size_t slot_bytes) {
  if (size < 1 || rank < 0 || rank >= size) throw ShmError(ShmError::Kind::Setup, "shm: bad rank/size");
  slot_bytes = std::max<size_t>(kPage * 2, (slot_bytes + 2 * kPage - 1) / (2 * kPage) * (2 * kPage));
  static std::atomic<uint32_t> counter{0};
  std::random_device rd;
  const std::string name = "/torch_neuronx_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" +
                           std::to_string(rd() & 0xffffff);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    throw ShmError(ShmError::Kind::Setup, "shm_open(" + name + ") failed: " + std::strerror(errno));
  }
  const size_t bytes = segment_bytes(size, slot_bytes);
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw ShmError(ShmError::Kind::Setup, "ftruncate of " + name + " failed: " + std::strerror(err));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    const int err = errno;
    ::shm_unlink(name.c_str());
    throw ShmError(ShmError::Kind::Setup, "mmap of " + name + " failed: " + std::strerror(err));
  }
  auto* header = static_cast<Header*>(base);
  header->size = static_cast<uint64_t>(size);
  header->slot_bytes = slot_bytes;
  std::atomic_ref<uint64_t>(header->magic).store(kMagic, std::memory_order_release);
  return std::unique_ptr<ShmCollectives>(new ShmCollectives(name, rank, size, base, bytes, slot_bytes));
}

std::unique_ptr<ShmCollectives> ShmCollectives::attach(const std::string& name, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) throw ShmError(ShmError::Kind::Setup, "shm: bad rank/size");
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw ShmError(ShmError::Kind::Setup, "shm_open(" + name + ") failed: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kPage)) {
    ::close(fd);
    throw ShmError(ShmError::Kind::Setup, "shared-memory segment " + name + " is not ready");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) throw ShmError(ShmError::Kind::Setup, "mmap of " + name + " failed: " + std::strerror(errno));
  const auto* header = static_cast<const Header*>(base);
  const uint64_t magic = std::atomic_ref<const uint64_t>(header->magic).load(std::memory_order_acquire);
  if (magic != kMagic || header->size != static_cast<uint64_t>(size) ||
      segment_bytes(size, header->slot_bytes) != bytes) {
    ::munmap(base, bytes);
    throw ShmError(ShmError::Kind::Setup, "shared-memory segment " + name + " does not belong to a group of " +
                                              std::to_string(size) + " ranks");
  }
  return std::unique_ptr<ShmCollectives>(new ShmCollectives(name, rank, size, base, bytes, header->slot_bytes));
}

void ShmCollectives::unlink() noexcept { ::shm_unlink(name_.c_str()); }

ShmCollectives::Control& ShmCollectives::control(int r) const {
  return *reinterpret_cast<Control*>(static_cast<char*>(base_) + kPage * (1 + static_cast<size_t>(r)));
}

int64_t* ShmCollectives::words(int r, int half) const {
  return reinterpret_cast<int64_t*>(reinterpret_cast<char*>(&control(r)) + 128) + half * kExchangeWords;
}

namespace {
WorkCounters& work_counters(void* base) {
  return *reinterpret_cast<WorkCounters*>(static_cast<char*>(base) + 64);
}
}  // namespace

ShmCollectives::Offer& ShmCollectives::shared(int r, int half) const {
  return reinterpret_cast<Offer*>(reinterpret_cast<char*>(words(r, 0)) + 2 * kExchangeWords * sizeof(int64_t))[half];
}

char* ShmCollectives::slot(int r, int half) const {
  return static_cast<char*>(base_) + kPage * (1 + static_cast<size_t>(size_)) + static_cast<size_t>(r) * slot_bytes_ +
         static_cast<size_t>(half) * half_bytes();
}

// ---- synchronization ----------------------------------------------------------------
// Step g has arrivals 2g+1 ("my half holds what you need") and 2g+2 ("I have
// read yours, and my results are in my half"). Before a rank writes its
// half for step g, every peer must have arrived at 2g-1: a peer arrives
// there only after it finished reading step g-2, the last to use that half.

void ShmCollectives::check_usable(const char* what) const {
  if (aborted_.load()) throw ShmError(ShmError::Kind::Aborted, std::string(what) + ": the process group was aborted");
  if (broken_.load()) {
    throw ShmError(ShmError::Kind::Broken, std::string(what) +
                                               ": the shared-memory transport failed in an earlier collective "
                                               "(see that error); create a new process group");
  }
}

void ShmCollectives::fail(ShmError::Kind kind, const std::string& msg) {
  broken_ = true;
  // Peers waiting for this rank stop at once instead of timing out.
  control(rank_).aborted.store(1);
  futex_wake(&control(rank_).seq);
  throw ShmError(kind, msg);
}

bool ShmCollectives::peer_gone(int peer) const {
  const Control& c = control(peer);
  if (c.pid <= 0 || c.pidns != pidns_ || pidns_ == 0) return false;  // another pid namespace: cannot tell
  std::ifstream stat("/proc/" + std::to_string(c.pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  const char state = line[close + 2];
  return state == 'Z' || state == 'X';  // exited, not yet reaped
}

int ShmCollectives::begin_step(const char* what) {
  check_usable(what);
  const uint32_t g = step_++;
  if (g >= 1) wait_peers(2 * g - 1, what);
  return static_cast<int>(g & 1u);
}

void ShmCollectives::arrive() {
  // Called twice per step: the value is 2g+1 then 2g+2 for step g = step_-1.
  Control& me = control(rank_);
  const uint32_t next = me.seq.load(std::memory_order_relaxed) + 1;
  me.seq.store(next, std::memory_order_seq_cst);
  if (me.sleepers.load(std::memory_order_seq_cst) > 0) futex_wake(&me.seq);
}

void ShmCollectives::publish(const ShmCheck* check, int half) {
  if (!check || !check->count) return;
  if (check->count > kExchangeWords) throw Error("shared-memory collective: too many check words");
  std::memcpy(words(rank_, half), check->words, check->count * sizeof(int64_t));
}

void ShmCollectives::verify(const ShmCheck* check, int half) {
  if (!check || !check->count || !check->verify) return;
  std::vector<int64_t> all(static_cast<size_t>(size_) * check->count);
  for (int r = 0; r < size_; ++r) std::memcpy(&all[r * check->count], words(r, half), check->count * sizeof(int64_t));
  try {
    check->verify(all.data());
  } catch (...) {
    arrive();  // finish the step as the peers do: the group stays in step
    throw;
  }
}

void ShmCollectives::meet(const ShmCheck* check, int half, const char* what) {
  publish(check, half);
  arrive();
  wait_peers(2 * (step_ - 1) + 1, what);  // every peer's first arrival of this step
  verify(check, half);
}

void ShmCollectives::wait_peers(uint32_t target, const char* what) {
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) wait_peer(p, target, what);
  }
}

void ShmCollectives::wait_peer(int peer, uint32_t target, const char* what) {
  Control& c = control(peer);
  wait_word(c.seq, c.sleepers, target, peer, what);
}

void ShmCollectives::wait_word(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers, uint32_t target,
                               int peer, const char* what) {
  if (reached(word.load(std::memory_order_acquire), target)) return;
  const auto start = std::chrono::steady_clock::now();
  // Spin briefly (~2 µs), then yield, then sleep on the word. A peer that
  // has not arrived within a couple of microseconds is usually not running
  // (more runnable processes than cores, or both ranks on one core), and a
  // longer spin only keeps it off this core: a 20 µs spin ended 0-3 of
  // ~2000 waits at load 4-5, and two ranks sharing a core paid it on every
  // collective (docs/benchmarks.md). The yield phase still catches a peer
  // that is a few microseconds behind on another core.
  constexpr auto kSpin = std::chrono::microseconds(2);
  for (int i = 1;; ++i) {
    cpu_relax();
    if (reached(word.load(std::memory_order_acquire), target)) return;
    if (i % 8 == 0 && std::chrono::steady_clock::now() - start >= kSpin) break;
  }
  auto lastLiveness = start;
  const int first = peer < 0 ? 0 : peer, last = peer < 0 ? size_ - 1 : peer;  // whom we wait for
  while (true) {
    uint32_t seen = word.load(std::memory_order_acquire);
    if (reached(seen, target)) return;
    if (aborted_.load()) fail(ShmError::Kind::Aborted, std::string(what) + ": the process group was aborted");
    for (int p = first; p <= last; ++p) {
      if (p != rank_ && control(p).aborted.load()) {
        fail(ShmError::Kind::PeerGone,
             std::string(what) + ": peer rank " + std::to_string(p) + " failed or aborted (see its error)");
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline_) {
      const std::string whom = peer < 0 ? "the peers" : "rank " + std::to_string(peer);
      fail(ShmError::Kind::Timeout,
           std::string(what) + ": timed out waiting for " + whom + " (the peer may have hung or exited)");
    }
    if (now - lastLiveness > std::chrono::milliseconds(100)) {
      lastLiveness = now;
      for (int p = first; p <= last; ++p) {
        if (p != rank_ && peer_gone(p)) {
          fail(ShmError::Kind::PeerGone, std::string(what) + ": peer rank " + std::to_string(p) + " (pid " +
                                             std::to_string(control(p).pid) + ") exited");
        }
      }
    }
    if (now - start < std::chrono::microseconds(50)) {
      std::this_thread::yield();
      continue;
    }
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (word.load(std::memory_order_seq_cst) == seen && !aborted_.load()) {
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline_ - now);
      futex_wait(&word, seen, std::clamp(left, std::chrono::microseconds(1), std::chrono::microseconds(5000)));
    }
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ShmCollectives::abort() noexcept {
  aborted_ = true;
  broken_ = true;
  if (!base_) return;
  control(rank_).aborted.store(1);
  for (int r = 0; r < size_; ++r) futex_wake(&control(r).seq);
}

// ---- single-copy path ---------------------------------------------------------------------

bool ShmCollectives::enable_peer_access(BufferLocator locate, std::chrono::milliseconds timeout) {
  // Each rank offers a one-page memfd holding a marker; every peer must map
  // it through a pidfd and see the marker (same host, same pid namespace,
  // ptrace permission, no seccomp filter in the way).
  const SharedMapping probe = create_shared_mapping(kPage);
  const uint64_t marker = 0x4e52545850524f42ull ^ (static_cast<uint64_t>(::getpid()) << 8) ^ static_cast<uint64_t>(rank_);
  if (probe.base) std::memcpy(probe.base, &marker, sizeof(marker));
  const int64_t offer[3] = {probe.base ? probe.fd : -1, static_cast<int64_t>(marker), ::getpid()};
  std::vector<int64_t> all(static_cast<size_t>(size_) * 3);
  std::unique_ptr<PeerMemory> peers;
  bool agreed = true;
  try {
    exchange({offer, 3, [&](const int64_t* a) { std::copy(a, a + all.size(), all.begin()); }}, timeout);
    bool ok = true;
    for (int r = 0; r < size_ && ok; ++r) ok = all[3 * r] >= 0 && control(r).pidns == pidns_ && pidns_ != 0;
    std::vector<pid_t> pids(size_);
    for (int r = 0; r < size_; ++r) pids[r] = static_cast<pid_t>(all[3 * r + 2]);
    if (ok) {
      try {
        peers = std::make_unique<PeerMemory>(rank_, pids);
      } catch (const Error&) {
        ok = false;
      }
    }
    std::string why;
    for (int r = 0; r < size_ && ok; ++r) {
      if (r == rank_) continue;
      const SharedBuffer offered{1, all[3 * r], kPage, 0, 0};
      ok = peers->probe(r, offered, static_cast<uint64_t>(all[3 * r + 1]), &why);
    }
    // Every rank learns every rank's result: the path is on for all or none.
    const int64_t mine = ok ? 1 : 0;
    exchange({&mine, 1, [&](const int64_t* a) {
                for (int r = 0; r < size_; ++r) agreed = agreed && a[r] == 1;
              }},
             timeout);
  } catch (...) {
    destroy_shared_mapping(probe);
    throw;
  }
  destroy_shared_mapping(probe);  // every peer is past its probe
  if (agreed && peers) {
    peers_ = std::move(peers);
    locate_ = std::move(locate);
  }
  return peer_access();
}


bool ShmCollectives::direct_step(const DirectPlan& plan, const ShmCheck*& check, const char* what) {
  const int h = begin_step(what);
  shared(rank_, h) = {locate_(plan.in, plan.in_bytes), plan.out ? locate_(plan.out, plan.out_bytes) : SharedBuffer{},
                      plan.mode};
  meet(check, h, what);
  bool insOk = true, outsOk = true;
  for (int r = 0; r < size_; ++r) {
    const Offer& o = shared(r, h);
    insOk = insOk && o.in.serial != 0 && o.mode == plan.mode;
    outsOk = outsOk && (!plan.out || o.out.serial != 0);
  }
  if (!insOk || (!outsOk && !plan.mine)) {
    arrive();
    check = nullptr;  // verified in this step
    return false;
  }
  std::vector<char*> ins(size_), outs(size_);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) {
      ins[r] = const_cast<char*>(static_cast<const char*>(plan.in));
      outs[r] = const_cast<char*>(static_cast<const char*>(plan.out));
      continue;
    }
    std::string error;
    ins[r] = peers_->map(r, shared(r, h).in, plan.in_bytes, &error);
    if (ins[r] && plan.out && outsOk) outs[r] = peers_->map(r, shared(r, h).out, plan.out_bytes, &error);
    if (!ins[r] || (plan.out && outsOk && !outs[r])) {
      const auto kind = errno == ESRCH ? ShmError::Kind::PeerGone : ShmError::Kind::Setup;
      fail(kind, std::string(what) + ": " + error);
    }
  }
  if (!plan.shared || !outsOk) {
    // Each rank runs its own items (all of them, or `mine` when some
    // rank's output cannot be mapped).
    for (size_t i = 0; i < plan.items; ++i) {
      if (outsOk || plan.mine(i)) plan.run(i, ins.data(), outs.data());
    }
    store_fence();
    arrive();
    // Peers may still read or write our buffers: they are the caller's
    // again only once every rank is done.
    wait_peers(2 * (step_ - 1) + 2, what);
    return true;
  }
  // Any rank does any item: whoever runs takes the next one, so a rank the
  // scheduler left out (more ranks than cores) does not hold up the others.
  // Every rank claims once past the end, hence the next base.
  WorkCounters& w = work_counters(base_);
  const uint32_t items = static_cast<uint32_t>(plan.items);
  uint32_t finished = 0;
  while (true) {
    const uint32_t i = w.claimed.fetch_add(1, std::memory_order_relaxed) - claim_base_;
    if (i >= items) break;
    plan.run(i, ins.data(), outs.data());
    ++finished;
  }
  claim_base_ += items + static_cast<uint32_t>(size_);
  done_base_ += items;
  store_fence();
  if (finished) {
    w.done.fetch_add(finished, std::memory_order_seq_cst);
    if (w.sleepers.load(std::memory_order_seq_cst) > 0) futex_wake(&w.done);
  }
  arrive();
  // Every item is done: nobody touches the buffers any more.
  wait_word(w.done, w.sleepers, done_base_, -1, what);
  return true;
}

// ---- collectives ------------------------------------------------------------------------

void ShmCollectives::start(const char* what, std::chrono::milliseconds timeout) {
  check_usable(what);
  deadline_ = std::chrono::steady_clock::now() + std::min(timeout, kMaxTimeout);
}

void ShmCollectives::slot_steps(size_t total, size_t maxStep, const ShmCheck* check, const char* what,
                                const std::function<void(size_t a, size_t c, int h, const ShmCheck* check)>& step) {
  for (size_t a = 0; a < total || (total == 0 && a == 0); a += maxStep) {
    step(a, std::min(maxStep, total - a), begin_step(what), a == 0 ? check : nullptr);
    if (total == 0) break;
  }
}

void ShmCollectives::all_reduce(void* data, size_t count, ShmDtype dtype, ShmReduceOp op,
                                std::chrono::milliseconds timeout, const ShmCheck* check) {
  constexpr const char* what = "shared-memory all_reduce";
  start(what, timeout);
  if (!shm_supports(dtype, op)) throw Error("shared-memory all_reduce: AVG needs a floating-point dtype");
  const size_t es = shm_dtype_size(dtype);
  const size_t maxStep = half_bytes() / es;
  // Small messages: one synchronization per step, every rank reducing the
  // whole step in rank order (so all ranks still hold identical bits).
  const bool oneShot = count * es <= std::min(kOneShotBytes, half_bytes());
  char* base = static_cast<char*>(data);
  if (peers_ && count * es >= kDirectBytes) {
    // Item i: elements [i * per, (i + 1) * per) reduced from every rank's
    // tensor into all of them (whole cache lines: no two ranks write one).
    const size_t per = std::max<size_t>(1, kItemBytes / es);
    const bool stream = streams(count * es * size_);
    DirectPlan plan;
    plan.in = data;
    plan.in_bytes = count * es;
    plan.items = (count + per - 1) / per;
    plan.run = [&](size_t i, char* const* ins, char* const*) {
      const size_t lo = i * per, n = std::min(per, count - lo);
      std::vector<const void*> srcs(size_);
      std::vector<void*> dsts;
      dsts.push_back(ins[rank_] + lo * es);  // ours first: the others copy it from L1
      for (int r = 0; r < size_; ++r) {
        srcs[r] = ins[r] + lo * es;
        if (r != rank_) dsts.push_back(ins[r] + lo * es);
      }
      reduce(dtype, op, srcs.data(), size_, dsts.data(), size_, n, stream);
    };
    if (direct_step(plan, check, what)) return;
  }
  std::vector<const void*> srcs(size_);
  slot_steps(count, maxStep, check, what, [&](size_t a, size_t c, int h, const ShmCheck* stepCheck) {
    const size_t per = oneShot ? c : portion(c, size_, es);
    const int me = oneShot ? 0 : rank_;  // the portion this rank reduces
    auto lo = [&](int r) { return std::min(c, per * static_cast<size_t>(r)); };
    auto hi = [&](int r) { return std::min(c, per * static_cast<size_t>(r + 1)); };
    char* chunk = base + a * es;
    char* mine = slot(rank_, h);
    if (oneShot) {
      std::memcpy(mine, chunk, c * es);
    } else {  // peers reduce the other portions: hand them ours
      std::memcpy(mine, chunk, lo(me) * es);
      std::memcpy(mine + hi(me) * es, chunk + hi(me) * es, (c - hi(me)) * es);
    }
    meet(stepCheck, h, what);
    for (int r = 0; r < size_; ++r) srcs[r] = r == rank_ ? chunk + lo(me) * es : slot(r, h) + lo(me) * es;
    void* dsts[2] = {chunk + lo(me) * es, mine + lo(me) * es};
    reduce(dtype, op, srcs.data(), size_, dsts, oneShot ? 1 : 2, hi(me) - lo(me), false);
    arrive();
    if (!oneShot) {
      wait_peers(2 * (step_ - 1) + 2, what);
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) std::memcpy(chunk + lo(r) * es, slot(r, h) + lo(r) * es, (hi(r) - lo(r)) * es);
      }
    }
  });
}

void ShmCollectives::reduce_scatter(const void* input, void* output, size_t count, ShmDtype dtype, ShmReduceOp op,
                                    std::chrono::milliseconds timeout, const ShmCheck* check) {
  constexpr const char* what = "shared-memory reduce_scatter";
  start(what, timeout);
  if (!shm_supports(dtype, op)) throw Error("shared-memory reduce_scatter: AVG needs a floating-point dtype");
  const size_t es = shm_dtype_size(dtype);
  // A step carries `c` elements of every rank's block; whole cache lines.
  const size_t line = std::max<size_t>(1, 64 / es);
  const size_t maxStep = std::max(line, half_bytes() / (static_cast<size_t>(size_) * es) / line * line);
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  std::vector<const void*> srcs(size_);
  if (peers_ && count * es * size_ >= kDirectBytes) {
    // Item (d, j): elements [j * per, (j + 1) * per) of block d, reduced from
    // every rank's input into rank d's output.
    const size_t per = std::max<size_t>(1, kItemBytes / es);
    const size_t perBlock = std::max<size_t>(1, (count + per - 1) / per);
    const bool stream = streams(count * es * size_ * size_ + count * es * size_);
    DirectPlan plan;
    plan.in = input;
    plan.in_bytes = count * es * size_;
    plan.out = output;
    plan.out_bytes = count * es;
    plan.items = count ? perBlock * static_cast<size_t>(size_) : 0;
    plan.mine = [&](size_t i) { return i / perBlock == static_cast<size_t>(rank_); };  // an output is private
    plan.run = [&](size_t i, char* const* ins, char* const* outs) {
      const size_t d = i / perBlock, lo = (i % perBlock) * per, n = std::min(per, count - lo);
      std::vector<const void*> s(size_);
      for (int r = 0; r < size_; ++r) s[r] = ins[r] + (d * count + lo) * es;
      void* dst = outs[d] + lo * es;
      reduce(dtype, op, s.data(), size_, &dst, 1, n, stream);
    };
    if (direct_step(plan, check, what)) return;
  }
  slot_steps(count, maxStep, check, what, [&](size_t a, size_t c, int h, const ShmCheck* stepCheck) {
    char* mine = slot(rank_, h);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) std::memcpy(mine + r * maxStep * es, in + (r * count + a) * es, c * es);
    }
    meet(stepCheck, h, what);
    for (int r = 0; r < size_; ++r) {
      srcs[r] = r == rank_ ? in + (rank_ * count + a) * es : slot(r, h) + rank_ * maxStep * es;
    }
    void* dst = out + a * es;
    reduce(dtype, op, srcs.data(), size_, &dst, 1, c, false);
    arrive();  // done reading the peers' halves
  });
}

void ShmCollectives::all_gather(const void* input, void* const* outputs, size_t bytes,
                                std::chrono::milliseconds timeout, const ShmCheck* check) {
  constexpr const char* what = "shared-memory all_gather";
  start(what, timeout);
  const char* in = static_cast<const char*>(input);
  if (peers_ && bytes * size_ >= kDirectBytes) {
    const bool stream = streams(bytes * size_ * size_ + bytes * size_);
    bool contiguous = true;  // outputs[r] are the blocks of one buffer
    for (int r = 0; r < size_; ++r) contiguous = contiguous && outputs[r] == static_cast<char*>(outputs[0]) + r * bytes;
    const size_t perBlock = (bytes + kItemBytes - 1) / kItemBytes;
    DirectPlan plan;
    plan.in = input;
    plan.in_bytes = bytes;
    if (contiguous) {
      // Item (k, j): bytes [j * kItemBytes, ...) of rank k's input, written
      // into every rank's output (read once; in place, rank k's own output
      // already holds them).
      plan.out = outputs[0];
      plan.out_bytes = bytes * size_;
      plan.mode = 1;
      plan.items = perBlock * static_cast<size_t>(size_);
      plan.run = [&](size_t i, char* const* ins, char* const* outs) {
        const size_t k = i / perBlock, lo = (i % perBlock) * kItemBytes, n = std::min(kItemBytes, bytes - lo);
        std::vector<void*> dsts;
        for (int r = 0; r < size_; ++r) {
          char* d = outs[r] + k * bytes + lo;
          if (d != ins[k] + lo) dsts.push_back(d);
        }
        copy_to_all(dsts.data(), static_cast<int>(dsts.size()), ins[k] + lo, n, stream);
      };
    } else {
      // Separate output tensors (only ours are known): each rank copies
      // every input into its outputs itself.
      plan.mode = 2;
      plan.items = static_cast<size_t>(size_);
      plan.shared = false;
      plan.run = [&](size_t k, char* const* ins, char* const*) {
        if (outputs[k] != ins[k]) copy_bytes(outputs[k], ins[k], bytes, stream);
      };
    }
    if (direct_step(plan, check, what)) return;
  }
  slot_steps(bytes, half_bytes(), check, what, [&](size_t a, size_t c, int h, const ShmCheck* stepCheck) {
    std::memcpy(slot(rank_, h), in + a, c);
    meet(stepCheck, h, what);
    // Our own block while the peers' copies arrive (after the check).
    if (outputs[rank_] != input) std::memcpy(static_cast<char*>(outputs[rank_]) + a, in + a, c);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) std::memcpy(static_cast<char*>(outputs[r]) + a, slot(r, h), c);
    }
    arrive();
  });
}

void ShmCollectives::exchange(const ShmCheck& check, std::chrono::milliseconds timeout) {
  constexpr const char* what = "shared-memory argument check";
  start(what, timeout);
  const int h = begin_step(what);
  meet(&check, h, what);
  arrive();
}

}  // namespace neuronrt
