// The store protocol of the `neuron` c10d backend, defined here only:
// torch_neuronx/distributed.py reads it through torch_neuronx._C._distributed
// (_attempt_prefix, _TRANSPORT_PREFIX) when it builds the root group.
//
// Everything a group rendezvous (its Gloo transport's addresses, the
// shared-memory segment's name and who attached) lives under a per-attempt
// prefix of the group's store. A torchrun restart reuses the agent's store,
// where the previous attempt's keys remain: a rank would read a dead peer's
// Gloo address, or a stale "attached" flag and pick the shared-memory path
// while its peer took Gloo, and hang.
#pragma once

#include <c10/util/StringUtil.h>

#include <cstdlib>
#include <string>

namespace c10d::neuron_pg {

// "neuron/<TORCHELASTIC_RESTART_COUNT>/": the prefix of one attempt's keys.
inline std::string attempt_prefix() {
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return c10::str("neuron/", attempt ? attempt : "0", "/");
}

// Below the attempt prefix: the Gloo transport's keys and the shared-memory
// path's (ShmPath.h).
constexpr const char* kTransportPrefix = "gloo/";
constexpr const char* kShmPrefix = "shm/";

}  // namespace c10d::neuron_pg
