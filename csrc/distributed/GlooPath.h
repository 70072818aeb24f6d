// The Gloo path of the `neuron` c10d backend. Device memory is host memory,
// so every neuron tensor is handed to a per-group ProcessGroupGloo as a
// zero-copy CPU alias. A collective is data (Collective): what the ranks
// compare, which tensors the transport touches, its shared-memory body where
// it has one (ShmPath.h), and how to issue it on host views otherwise;
// ProcessGroupNeuron::run runs every one: on shared memory, or on Gloo the
// same way each time: agree, expose (synchronize the streams, take the
// runtime's host access), prepare, launch, complete. The p2p argument check
// is here too.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "csrc/distributed/Dtypes.h"
#include "csrc/distributed/ShmPath.h"

namespace c10d::neuron_pg {

// A collective prepared on host views: `run` issues the transport work,
// `after` runs on its completion (copy-backs; may keep scratch alive).
struct Issued {
  std::function<c10::intrusive_ptr<Work>()> run;
  std::function<void()> after;
};

// One collective. With `shm` set it runs on shared memory (a launch named
// `kernel`); otherwise on Gloo, where `prepare` runs once the streams of
// `outputs` and `inputs` are synchronized (it may read their data).
struct Collective {
  OpType type;
  std::chrono::milliseconds timeout;
  // What the argument agreement compares (Agreement.h).
  std::vector<at::Tensor> agreed;
  int64_t redop = -1;
  std::vector<at::Tensor> outputs;  // the work's result
  std::vector<at::Tensor> inputs;   // exposed with the outputs
  ShmPath::Body shm = nullptr;
  const char* kernel = nullptr;
  std::function<Issued()> prepare;
  std::vector<int64_t> inSplits = {}, outSplits = {};  // all_to_all, in elements
};

// The shape of the data-movement collectives: Gloo moves the host views
// (bytes for dtypes it has no kernels for) of `outs` and `ins` with `run`.
template <class Outs, class Ins, class Run>
std::function<Issued()> moved(Outs outs, Ins ins, Run run) {
  return [outs, ins, run]() {
    return Issued{[o = to_host(outs), i = to_host(ins), run]() mutable { return run(o, i); }, {}};
  };
}

// The shape of the in-place reductions: Gloo reduces the prepared inputs
// (scaled, widened) with gloo_opts, and the results are copied back. Without
// `keepResult` (reduce on a non-root rank, whose tensors stay as they were)
// Gloo works through a scratch: the prepared copy, else a copy of the input.
template <class Opts, class Run>
std::function<Issued()> reduced(std::vector<at::Tensor> tensors, Opts opts, Run run, bool keepResult = true) {
  return [tensors, opts, run, keepResult]() {
    auto host = host_view(tensors);
    auto in = reduction_input(host, opts.reduceOp);
    for (size_t i = 0; i < in.size() && !keepResult; ++i) {
      if (in[i].is_same(host[i])) in[i] = host[i].clone(at::MemoryFormat::Contiguous);
    }
    return Issued{[in, o = gloo_opts(opts), run]() mutable { return run(in, o); },
                  keepResult ? copy_back(host, in) : std::function<void()>([in] {})};
  };
}

// The shape of the reduce-scatters: Gloo reduces the prepared inputs into
// the outputs (scratch outputs of the widened dtype, copied back). The list
// form (`concatenated`: one output, its inputs one per rank) runs as the
// tensor form over their flat concatenation.
template <class Run>
std::function<Issued()> scattered(std::vector<at::Tensor> outputs, std::vector<at::Tensor> inputs,
                                  ReduceScatterOptions opts, Run run, bool concatenated = false) {
  return [outputs, inputs, opts, run, concatenated]() {
    auto hostOut = host_view(outputs);
    auto in = reduction_input(concatenated ? std::vector<at::Tensor>{cat_flat(inputs)} : host_view(inputs),
                              opts.reduceOp);
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < hostOut.size(); ++i) {
      const auto dtype = in[i].scalar_type();
      if (concatenated) {  // Gloo splits along dimension 0: a flat output for the flat input
        out.push_back(at::empty({hostOut[i].numel()}, hostOut[i].options().dtype(dtype)));
      } else {
        out.push_back(dtype == hostOut[i].scalar_type() ? hostOut[i] : hostOut[i].to(dtype));
      }
    }
    return Issued{[run, out, in, o = gloo_opts(opts)]() mutable { return run(out, in, o); },
                  [after = copy_back(hostOut, out), in] { after(); }};
  };
}

// all_gather into outputs of different sizes (NCCL gathers them; Gloo
// refuses): every rank pads its input to the largest output's bytes, the
// padded blocks are gathered as bytes, and each block's leading bytes go to
// its output.
std::function<Issued()> gathered_unevenly(c10::intrusive_ptr<Backend> gloo, std::vector<at::Tensor> outs,
                                          at::Tensor input, AllgatherOptions opts);

// Gloo checks outputs against inputs (or splits them along dimension 0):
// where both are contiguous it gets flat views (only of the outputs when
// `flattenInputs` is false).
void flat_views(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, bool flattenInputs = true);

// p2p argument check. Gloo moves p2p messages as bytes: a receive buffer
// larger than the message or of another dtype silently gets garbage. So
// (unless TORCH_NEURONX_COLLECTIVE_CHECK=0) each send is preceded by a small
// header (sender, dtype, numel, sizes) on a reserved tag, and the receiver
// compares it with its buffer once the message is in, raising
// DistBackendError on a mismatch. Both are posted eagerly, in the caller's
// order, on two tags that are each FIFO per pair of ranks, so several
// messages in flight between two ranks stay matched and no wait depends on
// another rank's completion thread. (A message larger than the receive
// buffer still makes Gloo abort the receiving process: Gloo checks that
// before anything of ours runs.)
int p2p_header_tag(int tag);
at::Tensor p2p_header(const at::Tensor& t, int rank);
at::Tensor p2p_header_buffer();
// Throws when the received `header` does not describe `expected`.
void p2p_compare(const at::Tensor& header, const at::Tensor& expected, int rank, int tag);

}  // namespace c10d::neuron_pg
