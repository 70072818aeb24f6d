// Runtime error types. The runtime has no torch dependency, so the PyTorch
// integration layer translates these into c10 exceptions (see csrc/aten).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace neuronrt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A device index outside [0, device_count()).
class InvalidDeviceError : public Error {
 public:
  InvalidDeviceError(int device, int count);
  int device;
  int count;
};

// A malformed NEURON_RT_* variable. Raised by checked entry points rather
// than at startup, so that a bad value cannot break `import torch`.
class ConfigurationError : public Error {
 public:
  using Error::Error;
};

// An allocation that does not fit in the device's HBM even after the cache
// was released.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(int device, size_t requested, size_t allocated,
                   size_t reserved, size_t capacity);
  int device;
  size_t requested;
  size_t allocated;
  size_t reserved;
  size_t capacity;
};

// A kernel that failed on a stream's executor, reported at the stream's next
// synchronization point (Stream.h).
class KernelError : public Error {
 public:
  using Error::Error;
};

// "1.50 GiB" style formatting shared by error messages and summaries.
std::string format_bytes(size_t bytes);

}  // namespace neuronrt
