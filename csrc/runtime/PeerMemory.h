// Peer memory: the buffers of other processes on this host, mapped into ours.
//
// The single-copy path of the intra-node collectives (ShmCollectives) reads
// and writes the peers' device memory directly, as CUDA IPC lets GPUs do.
// Device memory that peers may map lives in memfd-backed segments (the
// caching allocator makes large segments so once a group enabled it). A rank
// publishes where a buffer lives (SharedBuffer: the segment's fd number in
// its own process, a serial, the offset); a peer duplicates that fd through a
// pidfd (pidfd_getfd, same-user ptrace permission), maps the whole segment
// once and keeps the mapping for the next collectives on it.
//
// A peer's mapping keeps the segment's pages alive even after the owner
// released it, so an access is never a fault; the owner also publishes how
// many shareable segments it has released, and a change drops our mappings of
// its memory so released segments do not stay resident here.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace neuronrt {

// Where a buffer of this process lives, as a peer needs it (trivially
// copyable: it travels through the shared segment). serial 0: not shareable.
struct SharedBuffer {
  uint64_t serial = 0;         // the owner's segment id (never reused)
  int64_t fd = -1;             // the segment's fd in the owner's process
  uint64_t segment_bytes = 0;  // mapped length of the segment
  uint64_t offset = 0;         // of the buffer within the segment
  uint64_t releases = 0;       // shareable segments the owner released so far
};

// Resolves a pointer range of this process to its shareable segment.
using BufferLocator = std::function<SharedBuffer(const void* ptr, size_t bytes)>;

// The locator over the caching allocator's shareable segments. While it (or
// a copy) lives, the allocator makes new large segments shareable: the
// runtime decides device memory is shareable for as long as an intra-node
// group's engine holds this locator, and private again after the last.
BufferLocator device_buffer_locator();

// An anonymous memfd of `bytes` mapped read/write; -1 / nullptr on failure.
struct SharedMapping {
  int fd = -1;
  void* base = nullptr;
  size_t bytes = 0;
};
SharedMapping create_shared_mapping(size_t bytes);
void destroy_shared_mapping(const SharedMapping& m);

class PeerMemory {
 public:
  // pids[r] is rank r's process; our own entry is ignored. Opens a pidfd per
  // peer; throws Error when that is not possible (not Linux 5.6+, another
  // pid namespace).
  PeerMemory(int self, const std::vector<pid_t>& pids);
  ~PeerMemory();
  PeerMemory(const PeerMemory&) = delete;
  PeerMemory& operator=(const PeerMemory&) = delete;

  // The peer's buffer mapped in this process (its first byte). Returns
  // nullptr and sets `error` when the segment cannot be mapped (errno ESRCH:
  // the peer exited).
  char* map(int peer, const SharedBuffer& buffer, size_t bytes, std::string* error);
  // Maps the peer's segment just to check that this works and that its
  // first 8 bytes are `marker`; unmaps it.
  bool probe(int peer, const SharedBuffer& buffer, uint64_t marker, std::string* error);

 private:
  struct Mapping {
    void* base;
    size_t bytes;
  };
  void* map_segment(int peer, const SharedBuffer& buffer, std::string* error);
  void forget(int peer);

  int self_;
  std::vector<int> pidfds_;
  std::vector<std::unordered_map<uint64_t, Mapping>> maps_;  // per peer, by serial
  std::vector<uint64_t> releases_;                            // per peer, last seen
};

}  // namespace neuronrt
