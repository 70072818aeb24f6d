// AOTInductor's device header for `neuron` (torch_neuronx ships it; Inductor
// includes and precompiles aoti_include/<device>.h for the graph's device).
//
// A neuron AOTI model is host code over host-mappable device memory: fused
// kernels are Inductor's C++ kernels and aten fallbacks the CPU C shims, as in
// the cpp_wrapper route. The neuron AOTI model runner (csrc/python/AotiRunner.cpp)
// runs the whole model as one launch on the runtime, so the model itself
// needs nothing beyond the CPU header.
#pragma once

#include <torch/csrc/inductor/aoti_include/cpu.h>
