#pragma once

namespace at::neuron {
// True if `ptr` lies inside a live pinned-memory block.
bool is_pinned_ptr(const void* ptr);
}  // namespace at::neuron
