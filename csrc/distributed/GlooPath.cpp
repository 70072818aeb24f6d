#include "csrc/distributed/GlooPath.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "csrc/aten/NeuronFunctions.h"
#include "csrc/distributed/Agreement.h"
#include "csrc/distributed/ProcessGroupNeuron.h"
#include "csrc/runtime/Runtime.h"

namespace c10d {
namespace neuron_pg {

namespace {
constexpr int64_t kP2PMagic = 0x4e52505032505031;  // "NRPP2PP1"
constexpr int kP2PMaxDims = 8;
constexpr int64_t kP2PHeaderWords = 5 + kP2PMaxDims;  // magic, sender, dtype, numel, ndim, sizes
constexpr int kP2PHeaderTagBit = 1 << 30;

std::string p2p_describe(const int64_t* p) {
  std::vector<int64_t> sizes(p + 5, p + 5 + std::min<int64_t>(p[4], kP2PMaxDims));
  return c10::str(static_cast<at::ScalarType>(p[2]), c10::IntArrayRef(sizes), p[4] > kP2PMaxDims ? "..." : "",
                  " (", p[3], " elements)");
}
}  // namespace

int p2p_header_tag(int tag) {
  TORCH_CHECK_VALUE(tag >= 0 && tag < kP2PHeaderTagBit, "neuron backend: p2p tags must be in [0, 2^30) (the ",
                    "argument check reserves the rest), got ", tag,
                    "; TORCH_NEURONX_COLLECTIVE_CHECK=0 lifts the limit");
  return tag | kP2PHeaderTagBit;
}

at::Tensor p2p_header(const at::Tensor& t, int rank) {
  at::Tensor h = at::zeros({kP2PHeaderWords}, at::kLong);
  int64_t* p = h.data_ptr<int64_t>();
  p[0] = kP2PMagic;
  p[1] = rank;
  p[2] = static_cast<int64_t>(t.scalar_type());
  p[3] = t.numel();
  p[4] = t.dim();
  for (int64_t d = 0; d < t.dim() && d < kP2PMaxDims; ++d) p[5 + d] = t.size(d);
  return h;
}

at::Tensor p2p_header_buffer() {
  return at::empty({kP2PHeaderWords}, at::kLong);
}

void p2p_compare(const at::Tensor& header, const at::Tensor& expected, int rank, int tag) {
  const int64_t* got = header.data_ptr<int64_t>();
  const int64_t* want = expected.data_ptr<int64_t>();
  TORCH_CHECK(got[0] == kP2PMagic, "p2p argument check: rank ", rank, " read a malformed header (a peer with ",
              "TORCH_NEURONX_COLLECTIVE_CHECK=0, or the tag in use outside the neuron backend?)");
  if (got[2] != want[2] || got[3] != want[3]) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("p2p mismatch: rank ", got[1], " sent ", p2p_describe(got), " but rank ", rank,
                             " receives into ", p2p_describe(want), " (tag ", tag, ")"));
  }
}

std::function<Issued()> gathered_unevenly(c10::intrusive_ptr<Backend> gloo, std::vector<at::Tensor> outs,
                                          at::Tensor input, AllgatherOptions opts) {
  return [gloo, outs, input, opts] {
    const int64_t block = largest_bytes(outs);
    at::Tensor in = padded_bytes(input, block);
    at::Tensor out = at::empty({block * gloo->getSize()}, at::kByte);
    return Issued{[gloo, in, out, opts]() mutable { return gloo->_allgather_base(out, in, opts); },
                  [outs, out, in, block] { copy_blocks(host_view(outs), out, block); }};
  };
}

void flat_views(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, bool flattenInputs) {
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].is_contiguous() || !ins[i].is_contiguous()) continue;
    outs[i] = outs[i].view({-1});
    if (flattenInputs) ins[i] = ins[i].view({-1});
  }
}

}  // namespace neuron_pg

std::shared_ptr<void> ProcessGroupNeuron::expose(const std::vector<at::Tensor>& a,
                                                const std::vector<at::Tensor>& b) {
  const auto devices = neuron_pg::devices_of(a, b);
  if (devices.empty()) return nullptr;
  // The transport reads and writes host views of the buffers on its own
  // threads, and our own preparation (scaled or widened scratch copies) reads
  // them now: the kernels queued on the current streams (the producers of the
  // inputs, earlier readers of the outputs) run first. A failed queued kernel
  // raises here, before anything moves.
  for (const c10::Device& d : devices) {
    at::neuron::rt_call([&] { neuronrt::current_stream(d.index()).synchronize(); });
  }
  return neuronrt::host_access();
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::launch(std::shared_ptr<void> access, OpType type,
                                                    std::chrono::milliseconds opTimeout,
                                                    std::vector<at::Tensor> outputs, const neuron_pg::Issued& issued) {
  auto work = makeWork(type, opTimeout, std::move(outputs));
  c10::intrusive_ptr<Work> transport = issued.run();
  tracker_.track(work, std::move(transport), issued.after, std::move(access));
  return work;
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::run(const neuron_pg::Collective& call) {
  if (call.shm) return launchShm(call);
  agree(call.type, call.timeout,
        neuron_pg::agreement_words(call.type, size_, call.agreed, call.inSplits, call.outSplits, call.redop));
  auto access = expose(call.outputs, call.inputs);
  return launch(std::move(access), call.type, call.timeout, call.outputs, call.prepare());
}

}  // namespace c10d
