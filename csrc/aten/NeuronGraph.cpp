// torch.accelerator.Graph on neuron: at::GraphImplInterface over the
// runtime's graphs (csrc/runtime/Graph.h, docs/graphs.md).
//
// A capture records the kernels queued on the current stream of the current
// device; allocations of the capturing thread come from the graph's private
// pool. There is no separate executable form: instantiate() only marks the
// graph ready (keep_graph=True defers it to the first replay, as on CUDA), and
// the recorded kernels are kept in both cases (debug_dump lists them).
#include <ATen/core/GraphImplInterface.h>
#include <c10/core/DeviceType.h>

#include <fstream>

#include "HostExecution.h"
#include "NeuronFunctions.h"
#include "NeuronGenerator.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {
namespace {

const char* mode_name(at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::Global: return "global";
    case at::GraphCaptureMode::ThreadLocal: return "thread_local";
    case at::GraphCaptureMode::Relaxed: return "relaxed";
    default: return "default";
  }
}

struct NeuronGraphImpl final : public at::GraphImplInterface {
  explicit NeuronGraphImpl(const at::GraphImplArgs& args) : keep_graph_(args.keep_graph) {}

  // Every mode behaves as "global": host waits on the capturing stream fail
  // from any thread (our streams have no per-thread capture state).
  void capture_begin(MempoolId_t pool, at::GraphCaptureMode mode) override {
    lazy_init();
    const c10::DeviceIndex device = current_device();
    neuronrt::Stream& stream = rt_call([&]() -> neuronrt::Stream& { return neuronrt::current_stream(device); });
    // As on CUDA: work on the default stream from anywhere in the program
    // (other threads, library code) would be recorded into the graph.
    TORCH_CHECK(stream.id() != 0, "cannot capture a graph on the default stream of neuron:", device,
                ": capture on a side stream (torch.neuron.graph() uses one; with torch.accelerator.Graph, "
                "enter a torch.neuron.Stream() first)");
    mode_ = mode_name(mode);
    rt_call([&] { graph_.capture_begin(stream, {pool.first, pool.second}); });
    begin_graph_rng(&stream);
    capture_stream_ = &stream;
    rngs_.clear();
    instantiated_ = false;
  }

  void capture_end() override {
    if (capture_stream_) rngs_ = end_graph_rng(capture_stream_);
    capture_stream_ = nullptr;
    rt_call([&] { graph_.capture_end(); });
    if (!keep_graph_) instantiate();
  }

  void instantiate() override {
    TORCH_CHECK(graph_.captured(), "instantiate() of a neuron graph that holds no capture");
    instantiated_ = true;
  }

  void replay() override {
    TORCH_CHECK(graph_.captured(), "replay() of a neuron graph that holds no capture");
    if (!instantiated_) instantiate();
    neuronrt::Stream& stream =
        rt_call([&]() -> neuronrt::Stream& { return neuronrt::current_stream(static_cast<c10::DeviceIndex>(graph_.device())); });
    // Each registered generator: this replay draws from its current (seed,
    // offset), which moves past the capture's draws (as CUDA graphs' Philox
    // seed/offset); the kernel queued first hands the pair to the recorded
    // draws in stream order.
    for (const auto& rng : rngs_) {
      auto* gen = rng->gen.get<NeuronGeneratorImpl>();
      std::pair<uint64_t, uint64_t> start;
      {
        std::lock_guard<std::mutex> lock(gen->mutex_);
        TORCH_CHECK(rng_mode() == RngMode::Philox, "replay() of a neuron graph with random ops needs the "
                    "\"philox\" rng mode it was captured in (torch.neuron.set_rng_mode(\"philox\"))");
        start = gen->reserve(rng->total);
      }
      queue_host_work(stream, "graph rng state", 0, [rng, start] {
        rng->seed.store(start.first);
        rng->base.store(start.second);
      });
    }
    rt_call([&] { graph_.replay(stream); });
  }

  void reset() override {
    if (capture_stream_) end_graph_rng(capture_stream_);
    capture_stream_ = nullptr;
    rngs_.clear();
    graph_.reset();
    instantiated_ = false;
  }

  MempoolId_t pool() const override {
    TORCH_CHECK(graph_.captured() || graph_.capturing(),
                "pool() of a neuron graph without a capture: call it after capture_begin()");
    const neuronrt::MempoolId id = graph_.pool();
    return {id.first, id.second};
  }

  void enable_debug_mode() override { debug_ = true; }

  // One line per recorded kernel, in replay order.
  void debug_dump(const std::string& path) override {
    TORCH_CHECK(debug_, "debug_dump() needs enable_debug_mode() before the capture");
    TORCH_CHECK(graph_.captured(), "debug_dump() of a neuron graph that holds no capture");
    std::ofstream out(path);
    TORCH_CHECK(out, "debug_dump(): cannot write ", path);
    const auto names = graph_.kernel_names();
    const auto pool = graph_.pool();
    out << "neuron graph: neuron:" << graph_.device() << ", " << names.size() << " kernels, pool (" << pool.first
        << ", " << pool.second << "), capture_error_mode " << mode_ << "\n";
    for (size_t i = 0; i < names.size(); ++i) out << i << "\t" << names[i] << "\n";
  }

 private:
  neuronrt::Graph graph_;
  const neuronrt::Stream* capture_stream_ = nullptr;  // while capturing
  std::vector<std::shared_ptr<GraphRng>> rngs_;      // generators the capture's random ops draw from
  bool keep_graph_;
  bool instantiated_ = false;
  bool debug_ = false;
  const char* mode_ = "default";
};

// The registry is keyed by c10::DeviceTypeName(PrivateUse1, false), which
// reads the backend's name: this library is loaded after the rename to
// "neuron" (torch_neuronx/__init__.py), so the key is the renamed one.
const bool registered = [] {
  const std::string key = c10::DeviceTypeName(c10::DeviceType::PrivateUse1, /*lower_case=*/false);
  if (!at::GraphImplRegistry()->Has(key)) {
    at::GraphImplRegistry()->Register(key, [](at::GraphImplArgs args) -> std::unique_ptr<at::GraphImplInterface> {
      return std::make_unique<NeuronGraphImpl>(args);
    });
  }
  return true;
}();

}  // namespace

// graph_pool_handle(): a pool id several graphs can share.
std::pair<uint64_t, uint64_t> graph_pool_handle() {
  const neuronrt::MempoolId id = neuronrt::graph_pool_handle();
  return {id.first, id.second};
}

bool is_current_stream_capturing() {
  const c10::DeviceIndex device = current_device();
  return rt_call([&] { return neuronrt::current_stream(device).is_capturing(); });
}

}  // namespace at::neuron
