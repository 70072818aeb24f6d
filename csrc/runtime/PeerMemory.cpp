#include "PeerMemory.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "CachingAllocator.h"
#include "Error.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace neuronrt {

BufferLocator device_buffer_locator() {
  // The locator keeps new large segments shareable while it lives: an engine
  // keeps it only once peer access is on (ShmCollectives::enable_peer_access).
  auto& allocator = CachingAllocator::instance();
  return [&allocator, hold = allocator.hold_shareable()](const void* ptr, size_t bytes) {
    return allocator.shared_buffer(ptr, bytes);
  };
}

SharedMapping create_shared_mapping(size_t bytes) {
  SharedMapping m;
  const int fd = static_cast<int>(::syscall(SYS_memfd_create, "neuron-device-memory", MFD_CLOEXEC));
  if (fd < 0) return m;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    ::close(fd);
    return m;
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    ::close(fd);
    return m;
  }
  return {fd, base, bytes};
}

void destroy_shared_mapping(const SharedMapping& m) {
  if (m.base) ::munmap(m.base, m.bytes);
  if (m.fd >= 0) ::close(m.fd);
}

PeerMemory::PeerMemory(int self, const std::vector<pid_t>& pids)
    : self_(self), pidfds_(pids.size(), -1), maps_(pids.size()), releases_(pids.size(), 0) {
  for (size_t r = 0; r < pids.size(); ++r) {
    if (static_cast<int>(r) == self_) continue;
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pids[r], 0));
    if (fd < 0) {
      const int err = errno;
      for (int p : pidfds_) {
        if (p >= 0) ::close(p);
      }
      throw Error("pidfd_open of rank " + std::to_string(r) + " (pid " + std::to_string(pids[r]) +
                  ") failed: " + std::strerror(err));
    }
    pidfds_[r] = fd;
  }
}

PeerMemory::~PeerMemory() {
  for (size_t r = 0; r < pidfds_.size(); ++r) {
    forget(static_cast<int>(r));
    if (pidfds_[r] >= 0) ::close(pidfds_[r]);
  }
}

void PeerMemory::forget(int peer) {
  for (auto& [serial, m] : maps_[peer]) ::munmap(m.base, m.bytes);
  maps_[peer].clear();
}

void* PeerMemory::map_segment(int peer, const SharedBuffer& b, std::string* error) {
  // The owner's fd number means nothing here: duplicate it into this process.
  const int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfds_[peer], static_cast<int>(b.fd), 0));
  if (fd < 0) {
    const int err = errno;
    *error = "pidfd_getfd of rank " + std::to_string(peer) + "'s device memory failed: " + std::strerror(err);
    errno = err;
    return nullptr;
  }
  // Populate the page tables now: the collectives that follow would
  // otherwise take one fault per page of the peer's segment.
  void* base = ::mmap(nullptr, b.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    *error = "mmap of rank " + std::to_string(peer) + "'s device memory failed: " + std::strerror(err);
    errno = err;
    return nullptr;
  }
  return base;
}

char* PeerMemory::map(int peer, const SharedBuffer& b, size_t bytes, std::string* error) {
  if (peer < 0 || peer >= static_cast<int>(maps_.size()) || peer == self_ || b.serial == 0 ||
      b.offset > b.segment_bytes || bytes > b.segment_bytes - b.offset) {
    *error = "rank " + std::to_string(peer) + " published an invalid device-memory range";
    errno = EINVAL;
    return nullptr;
  }
  if (b.releases != releases_[peer]) {  // it released segments: drop what we hold of them
    forget(peer);
    releases_[peer] = b.releases;
  }
  auto it = maps_[peer].find(b.serial);
  if (it == maps_[peer].end() || it->second.bytes != b.segment_bytes) {
    if (it != maps_[peer].end()) {
      ::munmap(it->second.base, it->second.bytes);
      maps_[peer].erase(it);
    }
    void* base = map_segment(peer, b, error);
    if (!base) return nullptr;
    it = maps_[peer].emplace(b.serial, Mapping{base, b.segment_bytes}).first;
  }
  return static_cast<char*>(it->second.base) + b.offset;
}

bool PeerMemory::probe(int peer, const SharedBuffer& b, uint64_t marker, std::string* error) {
  if (peer < 0 || peer >= static_cast<int>(maps_.size()) || peer == self_ || b.segment_bytes < sizeof(marker)) {
    return false;
  }
  void* base = map_segment(peer, b, error);
  if (!base) return false;
  uint64_t seen = 0;
  std::memcpy(&seen, base, sizeof(seen));
  ::munmap(base, b.segment_bytes);
  if (seen != marker) *error = "rank " + std::to_string(peer) + "'s probe segment holds other data";
  return seen == marker;
}

}  // namespace neuronrt
