// Process-level runtime state: whether this process has initialized the
// runtime, and whether it is a child forked from a process that had.
//
// A fork copies the address space but not the other threads: a runtime lock
// held by one of them at fork time stays held in the child forever, and the
// child's copy of device memory is no longer the parent's. So, as CUDA does,
// a child forked after initialization may not use the runtime: every entry
// point raises BadForkError before it takes any lock, and frees become no-ops
// (the memory goes away with the process). A child forked before
// initialization is a fresh process and initializes normally.
#pragma once

#include "Error.h"

namespace neuronrt {

class BadForkError : public Error {
 public:
  BadForkError();
};

// Marks the runtime initialized (idempotent, lock-free). Called by the entry
// points that create runtime state: allocation, streams, device switches.
void mark_initialized() noexcept;
bool is_initialized() noexcept;

// True in a child forked after this process (or an ancestor) initialized.
bool in_bad_fork() noexcept;

// Throws BadForkError in a bad fork; otherwise marks the runtime initialized.
void lazy_init();

}  // namespace neuronrt
