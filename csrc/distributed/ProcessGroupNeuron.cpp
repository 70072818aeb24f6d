// The `neuron` c10d backend: per collective, this rank's argument checks,
// then the shared-memory path (ShmPath) or the Gloo path (GlooPath); plus the
// constructor, split, settings and abort/shutdown. The reductions and the
// tensor forms of all_gather / reduce_scatter share one body each.
#include "csrc/distributed/ProcessGroupNeuron.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdlib>
#include <iostream>
#include <type_traits>

#include "csrc/aten/NeuronFunctions.h"
#include "csrc/distributed/Agreement.h"
#include "csrc/distributed/Arguments.h"
#include "csrc/distributed/Dtypes.h"
#include "csrc/distributed/StoreKeys.h"
#include "csrc/runtime/Runtime.h"

namespace c10d {

using namespace neuron_pg;

namespace {

class SilentWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

}  // namespace

ProcessGroupNeuron::ProcessGroupNeuron(c10::intrusive_ptr<Backend> gloo, int rank, int size,
                                       c10::intrusive_ptr<Options> options, c10::intrusive_ptr<Store> store)
    : Backend(rank, size), gloo_(std::move(gloo)), options_(std::move(options)) {
  TORCH_CHECK(gloo_, "ProcessGroupNeuron needs a transport backend");
  TORCH_CHECK(gloo_->getRank() == rank && gloo_->getSize() == size, "ProcessGroupNeuron: transport is rank ",
              gloo_->getRank(), " of ", gloo_->getSize(), ", expected rank ", rank, " of ", size);
  if (!options_) options_ = Options::create();
  const char* check = std::getenv("TORCH_NEURONX_COLLECTIVE_CHECK");
  checkAgreement_ = !(check && std::string(check) == "0");
  if (const char* mode = std::getenv("TORCH_NEURONX_ASYNC_ERROR_HANDLING")) {
    const std::string m(mode);
    TORCH_CHECK_VALUE(m == "0" || m == "1" || m == "2" || m == "3",
                      "TORCH_NEURONX_ASYNC_ERROR_HANDLING must be 0, 1, 2 or 3, got '", m, "'");
    errorHandling_ = std::stoi(m);
  }
  shm_ = ShmPath::connect(store, rank_, size_, options_->timeout);
  init();
}

ProcessGroupNeuron::~ProcessGroupNeuron() {
  shutdown();
  if (aborted_.load()) {
    // Destroying ProcessGroupGloo joins its workers, which sit in the aborted
    // collectives until the transport's timeout: that would stall whoever
    // drops the last reference (often Python, holding the GIL). An aborted
    // group's transport is left to finish on its own and leaked.
    (void)gloo_.release();
  }
}

std::chrono::milliseconds ProcessGroupNeuron::effectiveTimeout(std::chrono::milliseconds opTimeout) const {
  return opTimeout.count() > 0 ? opTimeout : options_->timeout;
}

std::string ProcessGroupNeuron::describeOp(OpType type, uint64_t seq, std::chrono::milliseconds opTimeout) const {
  const auto& g = options_->global_ranks_in_group;
  const std::string ranks = g.empty() ? c10::str("[0..", size_ - 1, "]") : c10::str("[", c10::Join(", ", g), "]");
  return c10::str("[neuron] ", opTypeToString(type), " (sequence number ", seq, ", group '", pg_uid_, "', rank ",
                  rank_, " of ranks ", ranks, ", timeout ", effectiveTimeout(opTimeout).count(), " ms)");
}

c10::intrusive_ptr<WorkNeuron> ProcessGroupNeuron::makeWork(OpType type, std::chrono::milliseconds opTimeout,
                                                            std::vector<at::Tensor> outputs) {
  checkUsable();
  const uint64_t seq = ++seq_;
  auto devices = devices_of(outputs);
  return c10::make_intrusive<WorkNeuron>(rank_, type, seq, describeOp(type, seq, opTimeout),
                                         effectiveTimeout(opTimeout),
                                         std::move(outputs), std::move(devices), error_, tracker_.watchdog());
}

void ProcessGroupNeuron::checkUsable() const {
  if (aborted_.load()) {
    C10_THROW_ERROR(DistBackendError, c10::str("neuron process group '", pg_uid_,
                                               "' was aborted; create a new process group to continue"));
  }
  if (shutdown_.load()) {
    C10_THROW_ERROR(DistBackendError, c10::str("neuron process group '", pg_uid_, "' was shut down"));
  }
}

void ProcessGroupNeuron::setTimeout(std::chrono::milliseconds timeout) {
  options_->timeout = timeout;
  gloo_->setTimeout(timeout);
}

void ProcessGroupNeuron::setGroupUid(const std::string& pg_uid) {
  Backend::setGroupUid(pg_uid);
  gloo_->setGroupUid(pg_uid);
}

void ProcessGroupNeuron::setSequenceNumberForGroup() {
  gloo_->setSequenceNumberForGroup();
  seq_ = 0;
}

void ProcessGroupNeuron::handleTimeout(const std::string& what) {
  note_error(*error_, ErrorType::TIMEOUT);
  if (errorHandling_ == 0) return;
  const bool exitProcess = errorHandling_ == 1 || errorHandling_ == 3;
  std::cerr << what << " timed out; TORCH_NEURONX_ASYNC_ERROR_HANDLING=" << errorHandling_
            << (exitProcess ? ": exiting the process" : ": aborting the process group")
            << " (set it to 0 to only raise DistBackendError)" << std::endl;
  if (errorHandling_ == 1 || errorHandling_ == 2) abort();
  if (exitProcess) std::_Exit(1);  // no cleanup: other threads may be stuck in the transport
}

void ProcessGroupNeuron::abort() {
  aborted_ = true;
  if (shm_) shm_->abort();  // releases callers inside a shared-memory collective
  tracker_.abortAll();
  {
    std::lock_guard<std::mutex> lock(abortWaits_->mutex);
  }
  abortWaits_->cv.notify_all();
  // Gloo's own abort is not called: it has none for collectives, and the
  // transport's queued works end on its timeout without holding callers.
  shutdown();
}

void ProcessGroupNeuron::shutdown() {
  if (shutdown_.exchange(true)) return;
  tracker_.stop(aborted_.load());
}

c10::intrusive_ptr<Backend> ProcessGroupNeuron::split(const c10::intrusive_ptr<Store>& store,
                                                      const std::vector<int>& ranks,
                                                      const c10::intrusive_ptr<Backend::Options>& opts) {
  checkUsable();
  const std::string groupName = opts ? opts->group_name : std::string();
  const auto timeout = opts ? opts->timeout : options_->timeout;
  const std::string key = c10::str(groupName, "|", c10::Join(",", ranks));
  std::lock_guard<std::mutex> lock(splitMutex_);
  if (!lastSplitKey_.empty() && key == lastSplitKey_) return lastSplit_;

  const auto childStore = c10::make_intrusive<PrefixStore>(attempt_prefix(), store);
  c10::intrusive_ptr<Backend> childGloo;
  {
    // Gloo warns that our options are not its own and uses its defaults,
    // which is what we want (the timeout is set right after).
    SilentWarnings silent;
    c10::WarningUtils::WarningHandlerGuard guard(&silent);
    childGloo = gloo_->split(c10::make_intrusive<PrefixStore>(kTransportPrefix, childStore), ranks, nullptr);
  }
  c10::intrusive_ptr<Backend> child;
  if (childGloo) {
    childGloo->setTimeout(timeout);
    auto childOpts = Options::create(timeout);
    childOpts->group_name = groupName;
    if (opts) childOpts->group_desc = opts->group_desc;
    for (int r : ranks) {
      const auto& g = options_->global_ranks_in_group;
      childOpts->global_ranks_in_group.push_back(g.empty() ? static_cast<uint64_t>(r) : g.at(r));
    }
    child = c10::make_intrusive<ProcessGroupNeuron>(childGloo, childGloo->getRank(), childGloo->getSize(),
                                                    childOpts, childStore);
  }
  lastSplitKey_ = key;
  lastSplit_ = child;
  return child;
}

// ---- collectives -----------------------------------------------------------------
//
// Each collective first checks this rank's own arguments (validate(): a bad
// one raises ValueError/TypeError here and is announced to the peers, which
// raise DistBackendError), then runs on the shared-memory path where it has
// one, else on Gloo; either way the ranks first compare what they pass
// (agree(), or the first step of a shared-memory collective). Which path a
// collective takes depends only on what the ranks compared (op, dtype, sizes),
// never on local layout such as contiguity: ranks on different paths would
// wait for each other until the timeout.

c10::intrusive_ptr<Work> ProcessGroupNeuron::broadcast(std::vector<at::Tensor>& tensors,
                                                       const BroadcastOptions& opts) {
  validate(OpType::BROADCAST, opts.timeout, [&] {
    check_tensors("broadcast", tensors);
    check_root("broadcast", opts.rootRank, size_, "root");
  });
  return run({.type = OpType::BROADCAST, .timeout = opts.timeout, .agreed = tensors, .outputs = tensors,
              .prepare = moved(tensors, std::vector<at::Tensor>{}, [gloo = gloo_, opts](auto& t, auto&) {
                return gloo->broadcast(t, opts);
              })});
}

template <class Opts>
c10::intrusive_ptr<Work> ProcessGroupNeuron::reduction(
    OpType type, const char* op, const char* kernel, std::vector<at::Tensor>& tensors, const Opts& opts, int root,
    c10::intrusive_ptr<Work> (Backend::*gloo)(std::vector<at::Tensor>&, const Opts&)) {
  validate(type, opts.timeout, [&] {
    check_tensors(op, tensors);
    if (type == OpType::REDUCE) check_root(op, root, size_, "root");
    check_reduction_arg(tensors, opts.reduceOp, op);
  });
  // Only reduce's root receives the result; the other ranks' tensors stay as
  // they were (NCCL's contract). Gloo's reduce works in place through every
  // rank's buffer and would leave partial results there, so a non-root rank
  // hands the transport a scratch (reduced() without keepResult); on shared
  // memory it is an all_reduce whose result the non-roots drop.
  const bool keepResult = type != OpType::REDUCE || root == rank_;
  const bool onShm = shm_ && kernel && tensors.size() == 1 && shm_reduces(tensors[0], opts.reduceOp);
  return run({.type = type, .timeout = opts.timeout, .agreed = tensors, .redop = opts.reduceOp.op_,
              .outputs = tensors, .shm = onShm ? shm_->allReduce(tensors[0], opts.reduceOp, keepResult) : nullptr,
              .kernel = kernel, .prepare = reduced(tensors, opts, [backend = gloo_, gloo](auto& in, auto& o) {
                return (backend.get()->*gloo)(in, o);
              }, keepResult)});
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::allreduce(std::vector<at::Tensor>& tensors,
                                                       const AllreduceOptions& opts) {
  return reduction(OpType::ALLREDUCE, "all_reduce", "c10d::allreduce_ (shm)", tensors, opts, -1, &Backend::allreduce);
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const AllreduceCoalescedOptions& opts) {
  return reduction(OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", nullptr, tensors, opts, -1,
                   &Backend::allreduce_coalesced);
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::reduce(std::vector<at::Tensor>& tensors, const ReduceOptions& opts) {
  return reduction(OpType::REDUCE, "reduce", "c10d::reduce_ (shm)", tensors, opts, opts.rootRank, &Backend::reduce);
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const AllgatherOptions& opts) {
  constexpr const char* op = "all_gather";
  validate(OpType::ALLGATHER, opts.timeout, [&] {
    if (inputs.size() != 1) reject_value(ArgProblem::ListLength, op, ": takes one input tensor, got ", inputs.size());
    if (outputs.size() != 1) {
      reject_value(ArgProblem::ListLength, op, ": takes one output tensor list, got ", outputs.size());
    }
    if (static_cast<int>(outputs[0].size()) != size_) {
      reject_value(ArgProblem::ListLength, op, ": invalid output tensor list (expected length ", size_,
                   ", the group size, got ", outputs[0].size(), ")");
    }
    check_same_device(op, {{&inputs, "input"}, {&outputs[0], "output"}});
    for (int r = 0; r < size_; ++r) {
      check_dtype(op, outputs[0][r], c10::str("output ", r), inputs[0].scalar_type(), "input");
    }
    if (outputs[0][rank_].numel() != inputs[0].numel()) {
      reject_value(ArgProblem::Size, op, ": output ", rank_, " (this rank's own slot) must have the input's size, got ",
                   outputs[0][rank_].sizes(), " and ", inputs[0].sizes());
    }
  });
  // The ranks compare the output lists: rank r's input fills output r.
  // Outputs of different sizes are gathered as NCCL does (Gloo refuses).
  const std::vector<at::Tensor>& outs = outputs[0];
  bool even = true;
  for (const auto& o : outs) even = even && o.numel() == inputs[0].numel();
  return run({.type = OpType::ALLGATHER, .timeout = opts.timeout, .agreed = outs, .outputs = outs, .inputs = inputs,
              .shm = shm_ && shm_moves(inputs[0]) ? shm_->allGather(outs, inputs[0]) : nullptr,
              .kernel = "c10d::allgather_ (shm)",
              .prepare = even ? moved(outputs, inputs, [gloo = gloo_, opts](auto& o, auto& i) {
                return gloo->allgather(o, i, opts);
              }) : gathered_unevenly(gloo_, outs, inputs[0], opts)});
}

template <class Opts>
c10::intrusive_ptr<Work> ProcessGroupNeuron::tensorForm(OpType type, const char* op, std::vector<at::Tensor> outputs,
                                                        std::vector<at::Tensor> inputs, const Opts& opts,
                                                        bool coalesced) {
  constexpr bool gathers = std::is_same_v<Opts, AllgatherOptions>;
  validate(type, opts.timeout, [&] {
    check_world_sized(op, size_, inputs, outputs, gathers, coalesced);
    if constexpr (!gathers) check_reduction_arg(inputs, opts.reduceOp, op);
  });
  Collective call{.type = type, .timeout = opts.timeout, .agreed = inputs, .outputs = outputs, .inputs = inputs,
                  .kernel = gathers ? "c10d::_allgather_base_ (shm)" : "c10d::_reduce_scatter_base_ (shm)"};
  if constexpr (gathers) {
    if (shm_ && !coalesced && shm_moves(inputs[0])) call.shm = shm_->allGather(outputs, inputs[0]);
    // An output is any contiguous tensor of world x input elements (as NCCL
    // takes it; SyncBatchNorm passes [1, world * n]). Gloo splits it along
    // dim 0, so it gets the flat views.
    call.prepare = moved(outputs, inputs, [gloo = gloo_, opts, coalesced](auto& o, auto& i) {
      flat_views(o, i);
      return coalesced ? gloo->allgather_into_tensor_coalesced(o, i, opts) : gloo->_allgather_base(o[0], i[0], opts);
    });
  } else {
    call.redop = opts.reduceOp.op_;
    if (shm_ && !coalesced && shm_reduces(inputs[0], opts.reduceOp)) {
      call.shm = shm_->reduceScatter(outputs[0], inputs, opts.reduceOp);
    }
    call.prepare = scattered(outputs, inputs, opts, [gloo = gloo_, coalesced](auto& out, auto& in, auto& o) {
      return coalesced ? gloo->reduce_scatter_tensor_coalesced(out, in, o)
                       : gloo->_reduce_scatter_base(out[0], in[0], o);
    });
  }
  return run(call);
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const AllgatherOptions& opts) {
  return tensorForm(OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {output}, {input}, opts, false);
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const AllgatherOptions& opts) {
  return tensorForm(OpType::COALESCED, "all_gather_into_tensor_coalesced", outputs, inputs, opts, true);
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const AllgatherOptions& opts) {
  constexpr const char* op = "all_gather_coalesced";
  // torch.distributed documents (and Gloo implements) output_tensor_lists
  // indexed [rank][i], i the input. The vendor product indexes them
  // [i][rank]; that layout is accepted too when only it fits the shapes
  // (when both fit, e.g. as many equal-shaped inputs as ranks, torch's wins).
  std::vector<std::vector<at::Tensor>> byRank;
  validate(OpType::ALLGATHER_COALESCED, opts.timeout, [&] {
    check_nonempty(op, inputs, "input_tensor_list");
    const size_t n = inputs.size(), world = static_cast<size_t>(size_);
    ArgProblem problem = ArgProblem::Other, unused = ArgProblem::Other;
    const std::string torchLayout = list_layout_problem(
        outputs, world, [&](size_t, size_t i) -> const at::Tensor& { return inputs[i]; }, n, &problem);
    if (torchLayout.empty()) {
      byRank = outputs;
    } else if (list_layout_problem(outputs, n, [&](size_t i, size_t) -> const at::Tensor& { return inputs[i]; },
                                   world, &unused).empty()) {
      byRank.assign(world, {});
      for (size_t r = 0; r < world; ++r) {
        for (size_t i = 0; i < n; ++i) byRank[r].push_back(outputs[i][r]);
      }
    } else {
      const std::string msg = c10::str(op, ": output_tensor_lists must hold ", world, " lists (one per rank) of ", n,
                                       " tensors matching the inputs' dtypes and sizes: ", torchLayout);
      if (problem == ArgProblem::Dtype) reject_type(problem, msg);
      reject_value(problem, msg);
    }
    const std::vector<at::Tensor> flat = flatten(byRank);
    check_same_device(op, {{&inputs, "input"}, {&flat, "output"}});
  });
  // Gloo checks each output's shape against its input: hand it flat views.
  return run({.type = OpType::ALLGATHER_COALESCED, .timeout = opts.timeout, .agreed = inputs,
              .outputs = flatten(byRank), .inputs = inputs,
              .prepare = moved(byRank, inputs, [gloo = gloo_, opts](auto& o, auto& i) {
                for (auto& l : o) flat_views(l, i, /*flattenInputs=*/false);
                for (auto& t : i) t = t.is_contiguous() ? t.view({-1}) : t;
                return gloo->allgather_coalesced(o, i, opts);
              })});
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs, const GatherOptions& opts) {
  validate(OpType::GATHER, opts.timeout, [&] {
    check_rooted("gather", rank_, size_, opts.rootRank, "destination", inputs, "input", outputs, "output",
                 "gather_list");
  });
  return run({.type = OpType::GATHER, .timeout = opts.timeout, .agreed = inputs, .outputs = flatten(outputs),
              .inputs = inputs, .prepare = moved(outputs, inputs, [gloo = gloo_, opts](auto& o, auto& i) {
                return gloo->gather(o, i, opts);
              })});
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const ScatterOptions& opts) {
  validate(OpType::SCATTER, opts.timeout, [&] {
    check_rooted("scatter", rank_, size_, opts.rootRank, "source", outputs, "output", inputs, "input",
                 "scatter_list");
  });
  return run({.type = OpType::SCATTER, .timeout = opts.timeout, .agreed = outputs, .outputs = outputs,
              .inputs = flatten(inputs),
              .prepare = moved(outputs, inputs, [gloo = gloo_, opts](auto& o, auto& i) {
                return gloo->scatter(o, i, opts);
              })});
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const ReduceScatterOptions& opts) {
  constexpr const char* op = "reduce_scatter";
  validate(OpType::REDUCE_SCATTER, opts.timeout, [&] {
    if (outputs.size() != 1 || inputs.size() != 1) {
      reject_value(ArgProblem::ListLength, op, ": takes one output tensor and one list of inputs");
    }
    if (static_cast<int>(inputs[0].size()) != size_) {
      reject_value(ArgProblem::ListLength, op, ": needs ", size_, " input tensors (one per rank), got ",
                   inputs[0].size());
    }
    check_same_device(op, {{&outputs, "output"}, {&inputs[0], "input"}});
    for (size_t r = 0; r < inputs[0].size(); ++r) check_like(op, inputs[0][r], c10::str("input ", r), outputs[0], "output");
    check_reduction_arg(inputs[0], opts.reduceOp, op);
  });
  const bool onShm = shm_ && shm_reduces(outputs[0], opts.reduceOp);
  return run({.type = OpType::REDUCE_SCATTER, .timeout = opts.timeout, .agreed = outputs, .redop = opts.reduceOp.op_,
              .outputs = outputs, .inputs = flatten(inputs),
              .shm = onShm ? shm_->reduceScatter(outputs[0], inputs[0], opts.reduceOp) : nullptr,
              .kernel = "c10d::reduce_scatter_ (shm)",
              .prepare = scattered(outputs, inputs[0], opts, [gloo = gloo_](auto& out, auto& in, auto& o) {
                return gloo->_reduce_scatter_base(out[0], in[0], o);
              }, /*concatenated=*/true)});
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const ReduceScatterOptions& opts) {
  return tensorForm(OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output}, {input}, opts, false);
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const ReduceScatterOptions& opts) {
  return tensorForm(OpType::REDUCE_SCATTER_TENSOR_COALESCED, "reduce_scatter_tensor_coalesced", outputs, inputs, opts,
                    true);
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& outputSplits,
                                                           std::vector<int64_t>& inputSplits,
                                                           const AllToAllOptions& opts) {
  constexpr const char* op = "all_to_all_single";
  validate(OpType::ALLTOALL_BASE, opts.timeout, [&] {
    const std::vector<at::Tensor> in{input}, out{output};
    check_same_device(op, {{&in, "input"}, {&out, "output"}});
    check_dtype(op, output, "output tensor", input.scalar_type(), "input tensor");
    check_splits(op, input, inputSplits, size_, "input");
    check_splits(op, output, outputSplits, size_, "output");
  });
  // Splits in elements (dimension-0 rows times row size; none = equal).
  auto elements = [&](const at::Tensor& t, const std::vector<int64_t>& splits) {
    const int64_t row = t.dim() == 0 || t.size(0) == 0 ? 0 : t.numel() / t.size(0);
    std::vector<int64_t> out;
    for (int r = 0; r < size_; ++r) out.push_back(splits.empty() ? t.numel() / size_ : splits.at(r) * row);
    return out;
  };
  return run({.type = OpType::ALLTOALL_BASE, .timeout = opts.timeout, .agreed = {input}, .outputs = {output},
              .inputs = {input},
              .prepare = moved(output, input,
                               [gloo = gloo_, outputSplits, inputSplits, opts](auto& o, auto& i) mutable {
                                 return gloo->alltoall_base(o, i, outputSplits, inputSplits, opts);
                               }),
              .inSplits = elements(input, inputSplits), .outSplits = elements(output, outputSplits)});
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs, const AllToAllOptions& opts) {
  constexpr const char* op = "all_to_all";
  validate(OpType::ALLTOALL, opts.timeout, [&] {
    if (static_cast<int>(outputs.size()) != size_ || static_cast<int>(inputs.size()) != size_) {
      reject_value(ArgProblem::ListLength, op, ": needs ", size_, " input and output tensors (the group size), got ",
                   inputs.size(), " and ", outputs.size());
    }
    check_same_device(op, {{&inputs, "input"}, {&outputs, "output"}});
    for (int r = 0; r < size_; ++r) {
      check_dtype(op, inputs[r], c10::str("input ", r), outputs[0].scalar_type(), "outputs");
      check_dtype(op, outputs[r], c10::str("output ", r), outputs[0].scalar_type(), "outputs");
    }
  });
  // The list form runs as the flat form over one contiguous buffer each way.
  // (Splits of the host views: dtypes Gloo lacks move as bytes.)
  auto prepare = [gloo = gloo_, outputs, inputs, opts]() {
    const auto hostIns = to_host(inputs), hostOuts = to_host(outputs);
    std::vector<int64_t> inSplits = numels(hostIns), outSplits = numels(hostOuts);
    at::Tensor in = cat_flat(hostIns);
    at::Tensor out = at::empty({c10::sum_integers(outSplits)}, hostOuts[0].options());
    return Issued{[gloo, out, in, outSplits, inSplits, opts]() mutable {
                    return gloo->alltoall_base(out, in, outSplits, inSplits, opts);
                  },
                  [hostOuts, out, outSplits, in]() mutable {
                    const auto parts = out.split_with_sizes(outSplits);
                    for (size_t i = 0; i < hostOuts.size(); ++i) hostOuts[i].copy_(parts[i].view(hostOuts[i].sizes()));
                  }};
  };
  return run({.type = OpType::ALLTOALL, .timeout = opts.timeout, .agreed = {inputs.at(0)}, .outputs = outputs,
              .inputs = inputs, .prepare = prepare, .inSplits = numels(inputs), .outSplits = numels(outputs)});
}

// Point-to-point runs on Gloo only, with the p2p argument check (GlooPath.h).
c10::intrusive_ptr<Work> ProcessGroupNeuron::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  auto access = expose(tensors);
  auto host = to_host(tensors);
  auto message = [gloo = gloo_, host, dstRank, tag]() mutable { return gloo->send(host, dstRank, tag); };
  // Gloo sends straight from the buffer: keep the aliases alive until done.
  std::function<void()> after = [host] {};
  if (checkAgreement_ && tensors.size() == 1) {
    std::vector<at::Tensor> header{p2p_header(tensors[0], rank_)};
    auto headerWork = gloo_->send(header, dstRank, p2p_header_tag(tag));
    // The header left before the message (same pair, FIFO): its work is done
    // by the time the message's is, and this is its only waiter.
    after = [host, header, headerWork, timeout = effectiveTimeout(kUnsetTimeout)] { headerWork->wait(timeout); };
  }
  return launch(std::move(access), OpType::SEND, kUnsetTimeout, tensors, {message, after});
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::receive(std::vector<at::Tensor>& tensors, int srcRank, int tag,
                                                     OpType type) {
  auto access = expose(tensors);
  auto host = to_host(tensors);
  auto message = std::make_shared<c10::intrusive_ptr<Work>>();
  auto run = [gloo = gloo_, host, message, srcRank, tag]() mutable {
    *message = srcRank < 0 ? gloo->recvAnysource(host, tag) : gloo->recv(host, srcRank, tag);
    return *message;
  };
  if (!checkAgreement_ || tensors.size() != 1) {
    return launch(std::move(access), type, kUnsetTimeout, tensors, {run, [host]() {}});
  }
  std::vector<at::Tensor> header{p2p_header_buffer()};
  const at::Tensor expected = p2p_header(tensors[0], rank_);
  const int headerTag = p2p_header_tag(tag);
  const auto timeout = effectiveTimeout(kUnsetTimeout);
  // From any source, the header is received from the message's sender once
  // the message is in (the sender sent it first, so it is waiting).
  auto headerWork = std::make_shared<c10::intrusive_ptr<Work>>();
  if (srcRank >= 0) *headerWork = gloo_->recv(header, srcRank, headerTag);
  auto after = [gloo = gloo_, host, header, headerWork, message, expected, headerTag, tag, timeout,
                rank = rank_]() mutable {
    if (!*headerWork) *headerWork = gloo->recv(header, (*message)->sourceRank(), headerTag);
    (*headerWork)->wait(timeout);
    p2p_compare(header[0], expected, rank, tag);
  };
  return launch(std::move(access), type, kUnsetTimeout, tensors, {run, after});
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return receive(tensors, srcRank, tag, OpType::RECV);
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  // The header names the sender; sourceRank() reads it from the header's work.
  return receive(tensors, -1, tag, OpType::RECVANYSOURCE);
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::barrier(const BarrierOptions& opts) {
  // opts.device (from device_ids or the bound device) names the device whose
  // queued work must finish first.
  if (opts.device && opts.device->is_privateuseone()) {
    at::neuron::rt_call([&] { neuronrt::current_stream(opts.device->index()).synchronize(); });
  }
  return launch(nullptr, OpType::BARRIER, opts.timeout, {},
                {[gloo = gloo_, opts]() { return gloo->barrier(opts); }, {}});
}

}  // namespace c10d
