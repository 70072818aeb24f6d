#include "csrc/distributed/Arguments.h"

#include <c10/util/StringUtil.h>

#include "csrc/distributed/Dtypes.h"

namespace c10d::neuron_pg {

const char* arg_problem_text(int64_t p) {
  switch (static_cast<ArgProblem>(p)) {
    case ArgProblem::Device: return "tensors on different devices";
    case ArgProblem::EmptyList: return "an empty tensor list";
    case ArgProblem::ListLength: return "a tensor list of the wrong length";
    case ArgProblem::Dtype: return "mismatched dtypes";
    case ArgProblem::Size: return "mismatched tensor sizes";
    case ArgProblem::Splits: return "invalid split sizes";
    case ArgProblem::Reduction: return "a reduction its dtype does not support";
    default: return "invalid arguments";
  }
}


void check_nonempty(const char* op, const std::vector<at::Tensor>& ts, const char* what) {
  if (ts.empty()) reject_value(ArgProblem::EmptyList, op, ": Tensor list must be nonempty (", what, ")");
}

void check_tensors(const char* op, const std::vector<at::Tensor>& ts) {
  check_nonempty(op, ts, "tensors");
  check_same_device(op, {{&ts, "tensor"}});
}

void check_root(const char* op, int root, int size, const char* role) {
  if (root < 0 || root >= size) reject_value(ArgProblem::Other, op, ": invalid ", role, " rank ", root, " for group size ", size);
}

void check_same_device(const char* op, std::initializer_list<Located> lists) {
  const at::Tensor* first = nullptr;
  std::string firstName;
  for (const auto& l : lists) {
    for (size_t i = 0; i < l.tensors->size(); ++i) {
      const at::Tensor& t = (*l.tensors)[i];
      const std::string name = l.tensors->size() == 1 ? std::string(l.what) : c10::str(l.what, " ", i);
      if (!t.defined()) reject_value(ArgProblem::Other, op, ": ", name, " is an undefined tensor");
      if (t.is_sparse()) reject_value(ArgProblem::Other, op, ": Tensors must be dense (", name, " is sparse)");
      if (!first) {
        first = &t;
        firstName = name;
      } else if (t.device() != first->device()) {
        reject_value(ArgProblem::Device, op, ": Tensors must be on the same device, got ", firstName, " on ",
                     first->device(), " and ", name, " on ", t.device());
      }
    }
  }
}

void check_dtype(const char* op, const at::Tensor& t, const std::string& what, at::ScalarType want,
                 const char* wantWhat) {
  if (t.scalar_type() != want) {
    reject_type(ArgProblem::Dtype, op, ": ", what, " must be the same type as the ", wantWhat, ", got ",
                t.scalar_type(), " and ", want);
  }
}

void check_like(const char* op, const at::Tensor& t, const std::string& what, const at::Tensor& ref,
                const char* refWhat) {
  check_dtype(op, t, what, ref.scalar_type(), refWhat);
  if (t.numel() != ref.numel()) {
    reject_value(ArgProblem::Size, op, ": ", what, " must have the ", refWhat, "'s size, got ", t.sizes(), " and ",
                 ref.sizes());
  }
}

void check_splits(const char* op, const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                  const char* what) {
  if (splits.empty()) {
    if (t.dim() == 0 || t.size(0) % size != 0) {
      reject_value(ArgProblem::Splits, op, ": Tensor's dim 0 does not divide equally across group size (", what,
                   " has ", t.dim() == 0 ? 0 : t.size(0), " rows, group size ", size, ")");
    }
    return;
  }
  if (static_cast<int>(splits.size()) != size) {
    reject_value(ArgProblem::Splits, op, ": Number of tensor splits not equal to group size (", what, " splits ",
                 c10::IntArrayRef(splits), ", group size ", size, ")");
  }
  int64_t sum = 0;
  for (int64_t s : splits) {
    if (s < 0) reject_value(ArgProblem::Splits, op, ": Split sizes must be non-negative, got ", what, " splits ",
                            c10::IntArrayRef(splits));
    sum += s;
  }
  if (t.dim() == 0 || sum != t.size(0)) {
    reject_value(ArgProblem::Splits, op, ": Split sizes doesn't match total dim 0 size (", what, " splits ",
                 c10::IntArrayRef(splits), " sum to ", sum, ", ", what, " has ", t.dim() == 0 ? 0 : t.size(0),
                 " rows)");
  }
}

// gather's and scatter's arguments: one tensor on every rank (`single`) and,
// on the root only, a list of group-size tensors of its dtype and size
// (`lists`: the `listWhat` tensors, named `listName`). `role` names the root
// ("destination").
void check_rooted(const char* op, int rank, int size, int root, const char* role,
                  const std::vector<at::Tensor>& single, const char* singleWhat,
                  const std::vector<std::vector<at::Tensor>>& lists, const char* listWhat, const char* listName) {
  check_root(op, root, size, role);
  if (single.size() != 1) {
    reject_value(ArgProblem::ListLength, op, ": takes one ", singleWhat, " tensor, got ", single.size());
  }
  const std::vector<at::Tensor> flat = flatten(lists);
  check_same_device(op, {{&single, singleWhat}, {&flat, listWhat}});
  if (rank != root) {
    if (!flat.empty()) reject_value(ArgProblem::ListLength, op, ": only the ", role, " rank passes a ", listName);
    return;
  }
  if (lists.size() != 1 || static_cast<int>(lists[0].size()) != size) {
    reject_value(ArgProblem::ListLength, op, ": invalid ", listName, " on the ", role, " rank (expected ", size,
                 " tensors, the group size, got ", lists.empty() ? 0 : lists[0].size(), ")");
  }
  for (int r = 0; r < size; ++r) check_like(op, lists[0][r], c10::str(listName, "[", r, "]"), single[0], singleWhat);
}

void check_world_sized(const char* op, int size, const std::vector<at::Tensor>& inputs,
                       const std::vector<at::Tensor>& outputs, bool gathers, bool coalesced) {
  if (coalesced) {
    check_nonempty(op, inputs, "inputs");
    if (outputs.size() != inputs.size()) {
      reject_value(ArgProblem::ListLength, op, ": needs one output per input, got ", outputs.size(), " outputs and ",
                   inputs.size(), " inputs");
    }
  }
  check_same_device(op, {{&inputs, "input"}, {&outputs, "output"}});
  const auto& big = gathers ? outputs : inputs;
  const auto& small = gathers ? inputs : outputs;
  const char* bigWhat = gathers ? "output" : "input";
  const char* smallWhat = gathers ? "input" : "output";
  const char* rule = gathers ? "output tensor size must be equal to world_size times input tensor size"
                             : "input tensor must be the same size as output size times world size";
  for (size_t i = 0; i < big.size(); ++i) {
    const std::string name = coalesced ? c10::str(bigWhat, " tensor ", i) : c10::str(bigWhat, " tensor");
    check_dtype(op, big[i], name, small[i].scalar_type(), c10::str(smallWhat, " tensor").c_str());
    if (big[i].numel() == small[i].numel() * size) continue;
    if (coalesced) {
      reject_value(ArgProblem::Size, op, ": ", rule, " (", bigWhat, " ", i, " is ", big[i].sizes(), ", ", smallWhat,
                   " ", small[i].sizes(), ", world size ", size, ")");
    }
    reject_value(ArgProblem::Size, op, ": ", rule, " (", big[i].sizes(), " vs ", size, " x ", small[i].sizes(), ")");
  }
}

// What Gloo would reject with an obscure message (or not at all), rejected
// up front with a TypeError naming the op, the dtype and the way out.
void check_reduction_arg(const std::vector<at::Tensor>& tensors, const ReduceOp& op, const char* collective) {
  const auto kind = op.op_;
  const bool bitwise = kind == ReduceOp::BAND || kind == ReduceOp::BOR || kind == ReduceOp::BXOR;
  for (const auto& t : tensors) {
    const auto dtype = t.scalar_type();
    const bool floating = at::isFloatingType(dtype) || at::isComplexType(dtype);
    if (c10::isFloat8Type(dtype)) {
      reject_type(ArgProblem::Reduction, collective, " cannot reduce ", dtype,
                  " tensors: fp8 is supported for data movement only (broadcast, all_gather, gather, scatter, "
                  "all_to_all, send/recv). Upcast to bfloat16 or float32 to reduce.");
    }
    if (kind == ReduceOp::AVG && !floating) {
      reject_type(ArgProblem::Reduction, collective, " with ReduceOp.AVG needs floating-point or complex tensors, got ",
                  dtype, ": an integer average is not representable. Reduce with ReduceOp.SUM and divide.");
    }
    if (kind == ReduceOp::PREMUL_SUM && !floating) {
      reject_type(ArgProblem::Reduction, collective,
                  " with ReduceOp.PREMUL_SUM needs floating-point or complex tensors, got ", dtype, ".");
    }
    if (bitwise && !at::isIntegralType(dtype, /*includeBool=*/true)) {
      reject_type(ArgProblem::Reduction, collective, " with ReduceOp.", reduce_op_name(kind),
                  " needs integer or bool tensors, got ", dtype, ".");
    }
    if (at::isComplexType(dtype) && kind != ReduceOp::SUM && kind != ReduceOp::AVG && kind != ReduceOp::PREMUL_SUM) {
      reject_type(ArgProblem::Reduction, collective, " with ReduceOp.", reduce_op_name(kind),
                  " is not defined for complex tensors (", dtype, ").");
    }
  }
}

std::string list_layout_problem(const std::vector<std::vector<at::Tensor>>& lists, size_t count,
                                const std::function<const at::Tensor&(size_t list, size_t i)>& want,
                                size_t perList, ArgProblem* problem) {
  if (lists.size() != count) {
    *problem = ArgProblem::ListLength;
    return c10::str("expected ", count, " lists, got ", lists.size());
  }
  for (size_t l = 0; l < lists.size(); ++l) {
    if (lists[l].size() != perList) {
      *problem = ArgProblem::ListLength;
      return c10::str("list ", l, " has ", lists[l].size(), " tensors, expected ", perList);
    }
    for (size_t i = 0; i < perList; ++i) {
      const at::Tensor& o = lists[l][i];
      const at::Tensor& w = want(l, i);
      if (o.scalar_type() != w.scalar_type()) {
        *problem = ArgProblem::Dtype;
        return c10::str("output [", l, "][", i, "] is ", o.scalar_type(), ", its input ", w.scalar_type());
      }
      if (o.numel() != w.numel()) {
        *problem = ArgProblem::Size;
        return c10::str("output [", l, "][", i, "] has ", o.numel(), " elements, its input ", w.numel());
      }
    }
  }
  return {};
}

}  // namespace c10d::neuron_pg
