// Intra-node collectives over one POSIX shared-memory segment per group.
//
// The ranks of a process group that all run on this host exchange data
// through a segment each of them maps: every rank owns a control block
// (a sequence number other ranks wait on, a small word area for metadata)
// and a data slot split into two halves. A collective runs as a series of
// steps; in each step a rank copies what its peers need into one half of
// its slot, announces it, reduces (or copies out) what it owns from its
// peers' halves and announces that too. Alternating halves lets a rank fill
// the next step while slower peers still read the previous one, and bounds
// the segment size independent of the message size.
//
// Every wait has a deadline and also ends when a peer's process is gone or
// a rank aborted, so a dead peer yields an Error, never a hang. After such
// an error the group is unusable (its ranks no longer agree on the step
// count) and every later call raises at once.
//
// Single-copy path: once enable_peer_access() succeeded, collectives of at
// least kDirectBytes whose buffers every rank has in shareable device memory
// (PeerMemory.h) skip the slots: the first step publishes where each rank's
// buffer lives, and each rank then reduces (or copies) its share straight
// from the peers' buffers into the destinations, its own and theirs. A
// collective where some rank's buffer is not shareable notices it in that
// same step, on every rank, and continues through the slots.
//
// No torch: the distributed layer (csrc/distributed) maps its dtypes and
// ops onto ShmDtype/ShmReduceOp, does the rendezvous of the segment name
// through its c10d Store, and calls these methods inside a runtime launch,
// so device memory is accessed as kernels access it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "Error.h"
#include "PeerMemory.h"

namespace neuronrt {

enum class ShmDtype : uint8_t { Float32, Float64, Float16, BFloat16, Int8, UInt8, Int16, Int32, Int64 };
enum class ShmReduceOp : uint8_t { Sum, Avg, Min, Max, Product };

size_t shm_dtype_size(ShmDtype dtype) noexcept;
// AVG is defined for floating dtypes only (an integer mean is not representable).
bool shm_supports(ShmDtype dtype, ShmReduceOp op) noexcept;

// A collective that could not complete: a timeout, a peer that exited or
// aborted, a group broken by an earlier failure, or a local abort().
class ShmError : public Error {
 public:
  enum class Kind { Timeout, PeerGone, Aborted, Broken, Setup };
  ShmError(Kind kind, const std::string& what) : Error(what), kind(kind) {}
  Kind kind;
};

// Metadata the ranks compare before a collective moves data (op, dtype,
// sizes): published with the first step, so checking costs no extra round
// trip. `verify` sees every rank's words (size() x count) and throws to fail
// the collective; every rank runs it on the same words, so all of them fail
// together and the group stays usable.
struct ShmCheck {
  const int64_t* words = nullptr;
  size_t count = 0;
  std::function<void(const int64_t* all)> verify;
};

class ShmCollectives {
 public:
  // Bytes of each rank's data slot (two halves); a step moves at most half.
  static constexpr size_t kDefaultSlotBytes = size_t{8} << 20;
  // all_reduce steps up to this size reduce everything on every rank (one
  // synchronization per step) instead of a portion each (two).
  static constexpr size_t kOneShotBytes = size_t{256} << 10;
  // int64 words each rank can publish per exchange() (per half).
  static constexpr size_t kExchangeWords = 224;
  // Messages from this size take the single-copy path when it is enabled.
  static constexpr size_t kDirectBytes = size_t{256} << 10;

  // Rank 0 creates a fresh segment (a unique name under /dev/shm); the
  // others attach() to name() once rank 0 published it. Throws ShmError
  // (Kind::Setup) when the segment cannot be created or mapped.
  static std::unique_ptr<ShmCollectives> create(int rank, int size, size_t slot_bytes = kDefaultSlotBytes);
  static std::unique_ptr<ShmCollectives> attach(const std::string& name, int rank, int size);
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Removes the name once every rank has attached: the memory then lives
  // exactly as long as the processes that map it (no leak under /dev/shm
  // when a job is killed).
  void unlink() noexcept;

  // In place on `count` contiguous elements. All ranks end with identical
  // bits: each element is reduced by one rank, in rank order.
  void all_reduce(void* data, size_t count, ShmDtype dtype, ShmReduceOp op, std::chrono::milliseconds timeout,
                  const ShmCheck* check = nullptr);
  // `input` holds size() blocks of `count` elements; rank r's `output`
  // (count elements) receives the reduction of block r over all ranks.
  void reduce_scatter(const void* input, void* output, size_t count, ShmDtype dtype, ShmReduceOp op,
                      std::chrono::milliseconds timeout, const ShmCheck* check = nullptr);
  // outputs[r] (size() pointers) receives rank r's `bytes` of input. An
  // output that is the input itself (in-place all_gather) is not copied.
  void all_gather(const void* input, void* const* outputs, size_t bytes, std::chrono::milliseconds timeout,
                  const ShmCheck* check = nullptr);
  // A step that only checks (see ShmCheck): what a rank whose collective
  // takes another transport runs, so it still meets the others' first step.
  // count <= kExchangeWords.
  void exchange(const ShmCheck& check, std::chrono::milliseconds timeout);

  // Collective over all ranks: checks that every rank can map every other
  // rank's memory (pidfd_getfd of a probe memfd) and, if all can, enables the
  // single-copy path, with `locate` telling where this rank's buffers live.
  // Returns whether it is enabled (the same answer on every rank). Throws
  // ShmError when a peer fails or times out during the probe.
  bool enable_peer_access(BufferLocator locate, std::chrono::milliseconds timeout);
  bool peer_access() const noexcept { return peers_ != nullptr; }

  // Fails this rank's waits at once (also from another thread) and tells the
  // peers, whose waits on this rank fail too. The group is unusable after.
  void abort() noexcept;
  bool broken() const noexcept { return broken_.load(); }

 private:
  struct Control;
  ShmCollectives(std::string name, int rank, int size, void* base, size_t bytes, size_t slot_bytes);

  Control& control(int r) const;
  char* slot(int r, int half) const;
  int64_t* words(int r, int half) const;
  size_t half_bytes() const { return slot_bytes_ / 2; }

  // A collective's start: fails if the group is unusable, sets the deadline.
  void start(const char* what, std::chrono::milliseconds timeout);
  // One step: returns the half to fill, after the peers finished reading it.
  int begin_step(const char* what);
  // The slot path's steps over `total` units, at most `maxStep` per step (one
  // step when `total` is 0): `step` moves units [a, a + c) through half `h`;
  // `check` travels with the first step only.
  void slot_steps(size_t total, size_t maxStep, const ShmCheck* check, const char* what,
                  const std::function<void(size_t a, size_t c, int h, const ShmCheck* check)>& step);
  void arrive();
  // After the first step's first arrival: publish/compare the check words.
  void publish(const ShmCheck* check, int half);
  void verify(const ShmCheck* check, int half);
  // A step's rendezvous: publish `check` (none: nullptr), arrive, wait for
  // every peer's arrival, compare the peers' check words.
  void meet(const ShmCheck* check, int half, const char* what);
  void wait_peers(uint32_t target, const char* what);
  void wait_peer(int peer, uint32_t target, const char* what);
  // Waits until `word` reaches `target`, failing on timeout, abort or the
  // exit of `peer` (every peer when negative).
  void wait_word(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers, uint32_t target, int peer,
                 const char* what);
  void check_usable(const char* what) const;
  // What a rank offers its peers in a single-copy step: its buffer, and
  // which buffer of the collective that is (all ranks must offer the same).
  struct Offer {
    SharedBuffer in;
    SharedBuffer out;
    uint64_t mode;
  };
  Offer& shared(int r, int half) const;
  // A single-copy step's work: `items` pieces, each run with every rank's
  // `in` (and `out`, when given) buffer mapped here. With `shared`, any rank
  // may run any item (claimed through a shared counter); otherwise each rank
  // runs all of its own.
  struct DirectPlan {
    const void* in = nullptr;
    size_t in_bytes = 0;
    const void* out = nullptr;
    size_t out_bytes = 0;
    uint64_t mode = 0;
    size_t items = 0;
    bool shared = true;
    std::function<void(size_t item, char* const* ins, char* const* outs)> run;
    // The items this rank runs itself when some rank's `out` is not
    // shareable (unset: the step then takes the slots).
    std::function<bool(size_t item)> mine;
  };
  // Publishes our buffers, meets the peers, and if every rank's buffers are
  // shareable and offered in the same mode, runs the plan; returns once no
  // rank touches our buffers any more. Returns false otherwise (the step is
  // complete, nothing moved, the check passed and is cleared).
  bool direct_step(const DirectPlan& plan, const ShmCheck*& check, const char* what);
  [[noreturn]] void fail(ShmError::Kind kind, const std::string& msg);
  bool peer_gone(int peer) const;

  std::string name_;
  int rank_;
  int size_;
  void* base_;
  size_t bytes_;
  size_t slot_bytes_;
  uint64_t pidns_ = 0;  // our pid namespace: peer liveness checks need the same one
  uint32_t step_ = 0;  // steps begun; identical on every rank
  uint32_t claim_base_ = 0;  // the shared work counters at this step's start
  uint32_t done_base_ = 0;
  std::chrono::steady_clock::time_point deadline_{};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> broken_{false};
  std::unique_ptr<PeerMemory> peers_;  // set by enable_peer_access
  BufferLocator locate_;
};

}  // namespace neuronrt
