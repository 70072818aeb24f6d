#include "csrc/distributed/ShmPath.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <unistd.h>

#include <cstdlib>

#include "csrc/distributed/Agreement.h"
#include "csrc/distributed/Completion.h"
#include "csrc/distributed/Dtypes.h"
#include "csrc/distributed/ProcessGroupNeuron.h"
#include "csrc/distributed/StoreKeys.h"
#include "csrc/runtime/Runtime.h"

namespace c10d {
namespace neuron_pg {

namespace {

std::string store_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> store_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// A 0/1 switch from the environment; anything else is a clear error.
bool env_switch(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  const std::string s(v);
  TORCH_CHECK_VALUE(s == "0" || s == "1", name, " must be 0 or 1, got '", s, "'");
  return s == "1";
}

}  // namespace

std::unique_ptr<ShmPath> ShmPath::connect(const c10::intrusive_ptr<Store>& store, int rank, int size,
                                          std::chrono::milliseconds timeout) {
  const bool direct = env_switch("TORCH_NEURONX_SHM_DIRECT", true);  // read before any rendezvous
  if (!env_switch("TORCH_NEURONX_SHM", true)) return nullptr;
  if (!store || size < 2) return nullptr;
  // Every rank reads every rank's keys, so all reach the same decision.
  auto s = c10::make_intrusive<PrefixStore>(kShmPrefix, store);
  // Publishes this rank's `mine` under `key`; whether every rank's is `want`.
  auto everyone = [&](const char* key, const std::string& mine, const std::string& want) {
    s->set(c10::str(key, "/", rank), store_bytes(mine));
    bool all = true;
    for (int r = 0; r < size; ++r) all = store_string(s->get(c10::str(key, "/", r))) == want && all;
    return all;
  };
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  if (!everyone("host", host, host)) return nullptr;  // spans hosts: Gloo only
  std::unique_ptr<neuronrt::ShmCollectives> shm;
  try {
    if (rank == 0) {
      std::string name;
      try {
        shm = neuronrt::ShmCollectives::create(0, size);
        name = shm->name();
      } catch (const neuronrt::ShmError&) {
      }
      s->set("name", store_bytes(name));  // empty: rank 0 could not create it
    } else {
      const std::string name = store_string(s->get("name"));
      if (!name.empty()) shm = neuronrt::ShmCollectives::attach(name, rank, size);
    }
  } catch (const neuronrt::ShmError&) {
    shm.reset();  // e.g. same host name, other host: the segment is not there
  }
  const bool all = everyone("attached", shm ? "1" : "0", "1");
  // Everyone has attached (or given up): the name is no longer needed, and
  // without it the segment goes away with the last process that maps it.
  if (rank == 0 && shm) shm->unlink();
  if (!all) return nullptr;
  // The single-copy path: peers map each other's device memory. The probe
  // is a collective: the ranks run it only if all of them want it.
  if (everyone("direct", direct ? "1" : "0", "1")) {
    try {
      // The runtime's locator keeps new large device segments shareable
      // while this engine holds it (PeerMemory.h).
      (void)shm->enable_peer_access(neuronrt::device_buffer_locator(), timeout);
    } catch (const neuronrt::ShmError&) {
      return nullptr;  // a peer failed during setup: this group stays on Gloo
    }
  }
  return std::make_unique<ShmPath>(std::move(shm), size);
}

void ShmPath::serialized(const std::function<void()>& step) {
  std::lock_guard<std::mutex> lock(mutex_);
  step();
}


ShmPath::Body ShmPath::allReduce(at::Tensor t, ReduceOp op, bool keepResult) const {
  return [shm = shm_.get(), t, op, keepResult](std::chrono::milliseconds timeout, const neuronrt::ShmCheck* check) {
    at::Tensor host = host_view(t);
    at::Tensor in = reduction_input(host, op);
    if (!keepResult && in.is_same(host)) in = host.clone(at::MemoryFormat::Contiguous);
    in = in.contiguous();
    shm->all_reduce(in.data_ptr(), static_cast<size_t>(in.numel()), *shm_dtype(in.scalar_type()), *shm_op(op.op_),
                    timeout, check);
    if (keepResult) copy_back({host}, {in})();
  };
}

ShmPath::Body ShmPath::allGather(std::vector<at::Tensor> outs, at::Tensor input) const {
  return [shm = shm_.get(), size = size_, outs, input](std::chrono::milliseconds timeout,
                                                       const neuronrt::ShmCheck* check) {
    const bool tensorForm = outs.size() == 1;
    const int64_t bytes = input.numel() * static_cast<int64_t>(input.element_size());
    const int64_t block = tensorForm ? bytes : largest_bytes(outs);
    at::Tensor in = block == bytes ? host_view(input).contiguous() : padded_bytes(input, block);
    // Each block goes straight into its output where that is contiguous and
    // exactly as long, else through one scratch of all blocks (`staged`
    // lists the outputs copied from it).
    std::vector<at::Tensor> hostOuts = host_view(outs), staged(hostOuts.size());
    at::Tensor scratch;
    std::vector<void*> ptrs;
    for (int r = 0; r < size; ++r) {
      const size_t i = tensorForm ? 0 : r;
      const at::Tensor& o = hostOuts[i];
      const bool direct = o.is_contiguous() && o.numel() * o.element_size() == (tensorForm ? size * block : block);
      if (!direct && !scratch.defined()) scratch = at::empty({block * size}, at::kByte);
      if (!direct) staged[i] = o;
      uint8_t* base = static_cast<uint8_t*>(direct ? o.data_ptr() : scratch.data_ptr());
      ptrs.push_back(base + (direct && !tensorForm ? 0 : r * block));
    }
    shm->all_gather(in.data_ptr(), ptrs.data(), static_cast<size_t>(block), timeout, check);
    if (scratch.defined()) copy_blocks(staged, scratch, block);
  };
}

ShmPath::Body ShmPath::reduceScatter(at::Tensor output, std::vector<at::Tensor> inputs, ReduceOp op) const {
  return [shm = shm_.get(), output, inputs, op](std::chrono::milliseconds timeout, const neuronrt::ShmCheck* check) {
    at::Tensor hostOut = host_view(output);
    at::Tensor in = reduction_input(cat_flat(inputs), op).contiguous();
    const bool direct = in.scalar_type() == hostOut.scalar_type() && hostOut.is_contiguous();
    at::Tensor out = direct ? hostOut : at::empty({hostOut.numel()}, in.options());
    shm->reduce_scatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(hostOut.numel()),
                        *shm_dtype(in.scalar_type()), *shm_op(op.op_), timeout, check);
    if (!direct) hostOut.copy_(out.view(hostOut.sizes()));
  };
}

}  // namespace neuron_pg

using namespace neuron_pg;

c10::intrusive_ptr<Work> ProcessGroupNeuron::launchShm(const Collective& call) {
  auto work = makeWork(call.type, call.timeout, call.outputs);
  tracker_.watch(work);  // a timeout reaches the watchdog (TORCH_NEURONX_ASYNC_ERROR_HANDLING)
  // The argument check travels with the collective's first step.
  std::vector<int64_t> words;
  std::string mismatch;
  neuronrt::ShmCheck check;
  if (checkAgreement_) {
    words = agreement_words(call.type, size_, call.agreed, {}, {}, call.redop);
    check = {words.data(), words.size(), [&](const int64_t* all) {
               mismatch = disagreement(size_, words, all);
               if (!mismatch.empty()) throw neuronrt::Error(mismatch);
             }};
  }
  const auto devices = devices_of(call.outputs);
  std::exception_ptr error;
  try {
    const neuronrt::ShmCheck* c = checkAgreement_ ? &check : nullptr;
    shm_->serialized([&] {
      if (devices.empty()) {
        call.shm(work->timeout(), c);  // cpu tensors
      } else {
        // A synchronous launch: it runs after the kernels queued on the stream
        // (the inputs' producers), and the collective is done when it returns.
        neuronrt::current_stream(devices[0].index()).launch([&] { call.shm(work->timeout(), c); }, call.kernel);
      }
    });
  } catch (...) {
    error = std::current_exception();
  }
  if (error && !mismatch.empty()) {
    // Every rank failed this check together and nothing moved: raise as
    // agree() does (the group stays usable); the work is retired unused.
    work->complete(nullptr, {});
    C10_THROW_ERROR(DistBackendError, c10::str(work->describe(), ": ", mismatch));
  }
  work->complete(error, {});
  return work;
}

}  // namespace c10d
