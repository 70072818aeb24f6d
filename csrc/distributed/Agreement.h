// The cross-rank argument agreement of the `neuron` c10d backend. Before a
// collective the ranks compare what they pass (op, reduce op, dtype, sizes;
// all_to_all splits pairwise) as a few int64 words per rank, over one small
// Gloo allgather or the first step of a shared-memory collective, and all
// raise the same DistBackendError on a mismatch: Gloo would abort the process
// or move garbage. A rank that rejected its own arguments (Arguments.h)
// publishes words that say so, and its peers name it in their error.
// TORCH_NEURONX_COLLECTIVE_CHECK=0 turns the check off (saves a round trip).
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "csrc/distributed/Arguments.h"

namespace c10d::neuron_pg {

// What a rank publishes: 4 + 2 x size words. `redop` is a
// ReduceOp::RedOpType (-1 for none); splits only for all_to_all.
std::vector<int64_t> agreement_words(OpType type, int size, const std::vector<at::Tensor>& tensors,
                                     const std::vector<int64_t>& inSplits = {},
                                     const std::vector<int64_t>& outSplits = {}, int64_t redop = -1);
// The words of a rank that rejected its own arguments with `problem`.
std::vector<int64_t> rejection_words(OpType type, int size, ArgProblem problem);
// The mismatch report, empty when every rank's words (`all`: size rows of
// mine.size() words) agree.
std::string disagreement(int size, const std::vector<int64_t>& mine, const int64_t* all);

}  // namespace c10d::neuron_pg
