// The op record: which ATen ops ran a neuron kernel and which went through
// the host fallback, since the last clear. torch_neuronx.get_executed_ops(),
// get_fallback_ops() and fallback_report() are views of it.
#pragma once

#include <ATen/core/operator_name.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace at::neuron {

// Notes that a neuron kernel of op `name` ("aten::add") ran. `name` must have
// static storage (a schema's name, an at::_ops::*::name): after a thread's
// first call per op and clear, a call is a thread-local load and compare.
void note_executed(const char* name);

// Counts a call of `op` that reached the host fallback; true for the first
// call since the record was last cleared.
bool note_fallback(const c10::OperatorName& op);

// The same records for names from Python (torch_neuronx.utils.log_*_op).
void note_executed_name(const std::string& name);
void note_fallback_name(const std::string& name);

// Executed op names, sorted.
std::vector<std::string> executed_ops();
// "aten::name.overload" -> calls that reached the fallback.
std::map<std::string, int64_t> fallback_ops();

void clear_executed_ops();
void clear_fallback_ops();

// `kernel` as a PrivateUse1 kernel that notes op `Op` (an at::_ops struct) as
// executed first: m.impl("histc", &Noted<at::_ops::histc, histc>::call).
template <class Op, auto kernel>
struct Noted;
template <class Op, class R, class... Args, R (*kernel)(Args...)>
struct Noted<Op, kernel> {
  static R call(Args... args) {
    note_executed(Op::name);
    return kernel(std::forward<Args>(args)...);
  }
};

}  // namespace at::neuron
