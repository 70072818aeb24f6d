// Trainium fidelity: NEURON_RT_TARGET selects the model of a real device
// (its core generation, logical cores per chip and HBM per core), and
// NEURON_RT_STRICT=1 makes the device refuse what that hardware cannot run
// (the PyTorch layer checks data types against it). Without a target the
// host runtime keeps its permissive defaults.
#pragma once

#include <cstddef>
#include <string>

namespace neuronrt {

struct TargetModel {
  std::string name;        // "trn2"; empty without NEURON_RT_TARGET
  std::string core_name;   // "NeuronCore-v3"
  int major = 3;           // NeuronCore generation
  int cores_per_chip = 2;  // logical NeuronCores per device (chip)
  size_t hbm_per_core = size_t{16} << 30;
};

// The selected model (NEURON_RT_TARGET, read once; the default model when
// unset). A malformed value is reported by check_configuration().
const TargetModel& target() noexcept;
// Whether NEURON_RT_STRICT is on (read once).
bool strict() noexcept;
// Empty when NEURON_RT_TARGET and NEURON_RT_STRICT are valid.
const std::string& target_error() noexcept;

}  // namespace neuronrt
