// This rank's own argument checks of the `neuron` c10d backend. A rank that
// rejects its arguments raises ValueError / TypeError with the details, and
// announces the kind of problem (ArgProblem) to its peers through the
// argument agreement (Agreement.h), whose error then names it. PyTorch's
// wording where ProcessGroupNCCL has a message for the condition.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <exception>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

namespace c10d::neuron_pg {

enum class ArgProblem : int64_t { Other = 1, Device, EmptyList, ListLength, Dtype, Size, Splits, Reduction };
const char* arg_problem_text(int64_t p);

struct ArgumentRejected {
  ArgProblem problem;
  std::exception_ptr error;
};

// Raises Error (c10::ValueError, c10::TypeError) as an ArgumentRejected.
template <class Error, typename... Args>
[[noreturn]] void reject(ArgProblem problem, const Args&... args) {
  throw ArgumentRejected{problem, std::make_exception_ptr(Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                                                c10::str("neuron backend: ", args...)))};
}
template <typename... Args>
[[noreturn]] void reject_value(ArgProblem problem, const Args&... args) {
  reject<c10::ValueError>(problem, args...);
}
template <typename... Args>
[[noreturn]] void reject_type(ArgProblem problem, const Args&... args) {
  reject<c10::TypeError>(problem, args...);
}

void check_nonempty(const char* op, const std::vector<at::Tensor>& ts, const char* what);
// The one-list collectives' tensors: a nonempty list, all on one device.
void check_tensors(const char* op, const std::vector<at::Tensor>& ts);
// A root rank of the group; `role` names it ("root", "destination").
void check_root(const char* op, int root, int size, const char* role);

// Every tensor of one collective on one device: all on the same neuron
// device, or all on cpu (NCCL: "Tensors must be on the same device").
struct Located {
  const std::vector<at::Tensor>* tensors;
  const char* what;
};
void check_same_device(const char* op, std::initializer_list<Located> lists);
void check_dtype(const char* op, const at::Tensor& t, const std::string& what, at::ScalarType want,
                 const char* wantWhat);
// `t` (named `what`) has the dtype and number of elements of `ref`.
void check_like(const char* op, const at::Tensor& t, const std::string& what, const at::Tensor& ref,
                const char* refWhat);
void check_splits(const char* op, const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                  const char* what);
// gather's and scatter's arguments: one tensor on every rank (`single`) and,
// on the root only, a list of group-size tensors of its dtype and size
// (`lists`: the `listWhat` tensors, named `listName`). `role` names the root
// ("destination").
void check_rooted(const char* op, int rank, int size, int root, const char* role,
                  const std::vector<at::Tensor>& single, const char* singleWhat,
                  const std::vector<std::vector<at::Tensor>>& lists, const char* listWhat, const char* listName);
// The tensor forms of all_gather (`gathers`) and reduce_scatter: per pair,
// the output (all_gather) or input (reduce_scatter) has world-size times the
// other's elements and its dtype; `coalesced`: lists of pairs.
void check_world_sized(const char* op, int size, const std::vector<at::Tensor>& inputs,
                       const std::vector<at::Tensor>& outputs, bool gathers, bool coalesced);
// What Gloo would reject with an obscure message (or not at all): a
// TypeError naming the op, the dtype and the way out.
void check_reduction_arg(const std::vector<at::Tensor>& tensors, const ReduceOp& op, const char* collective);
// Where this rank's tensors disagree with the shapes `want` (per list, per
// tensor: numel and dtype of the corresponding input); empty if they fit.
std::string list_layout_problem(const std::vector<std::vector<at::Tensor>>& lists, size_t count,
                                const std::function<const at::Tensor&(size_t list, size_t i)>& want,
                                size_t perList, ArgProblem* problem);

}  // namespace c10d::neuron_pg
