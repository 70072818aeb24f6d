// The profiler's view of the device.
//
// - torch.profiler (Kineto): a PrivateUse1 activity profiler registered with
//   REGISTER_PRIVATEUSE1_PROFILER. While a session runs, the runtime reports
//   every launch (kernel name, device, stream, duration); each becomes a
//   kernel (or memcpy) activity on a per-stream row of the trace, linked to
//   the CPU op that launched it through Kineto's correlation id, so
//   key_averages() gets device times and the chrome trace gets arrows.
// - torch.autograd.profiler.profile(use_device="neuron") (the legacy
//   profiler): ProfilerStubs that time ranges with the runtime's clock.
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <GenericTraceActivity.h>
#include <libkineto.h>
#include <IActivityProfiler.h>
#include <output_base.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "csrc/runtime/Runtime.h"

namespace torch_neuronx {
namespace {

int64_t unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct KernelRecord {
  const char* name;
  int device;
  int64_t stream;
  int64_t start_ns;
  int64_t end_ns;
  uint64_t correlation;
  int64_t graph_kernels;
};

// Kineto pushes the correlation id of each CPU op on the thread that runs it;
// the runtime reads it at launch time (set_correlation_source).
thread_local std::vector<uint64_t> tls_correlation;

class NeuronProfilerSession;
std::mutex g_mutex;                      // g_active and its records
NeuronProfilerSession* g_active = nullptr;

class NeuronProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  ~NeuronProfilerSession() override { stop(); }

  void start() override {
    std::lock_guard<std::mutex> lock(g_mutex);
    start_ns_ = unix_ns();
    g_active = this;
    neuronrt::set_correlation_source(&current_correlation);
    neuronrt::set_launch_observer(&on_launch);
  }

  void stop() override {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_active != this) return;
    neuronrt::set_launch_observer(nullptr);
    g_active = nullptr;
    end_ns_ = unix_ns();
  }

  // On the launching thread, where Kineto pushed the CPU op's id.
  static uint64_t current_correlation() { return tls_correlation.empty() ? 0 : tls_correlation.back(); }

  static void on_launch(const neuronrt::LaunchRecord& r) {
    const int64_t end = unix_ns();
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_active) return;
    g_active->records_.push_back({r.name, r.device, r.stream, end - static_cast<int64_t>(r.duration_ns), end,
                                  r.correlation, r.graph_kernels});
  }

  void pushCorrelationId(uint64_t id) override { tls_correlation.push_back(id); }
  void popCorrelationId() override {
    if (!tls_correlation.empty()) tls_correlation.pop_back();
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t,
                    int64_t) override {
    libkineto::TraceSpan span(start_ns_, end_ns_ ? end_ns_ : unix_ns(), "neuron");
    for (const KernelRecord& r : records_) {
      const bool copy = std::strncmp(r.name, "Memcpy", 6) == 0;
      const bool fill = std::strncmp(r.name, "Memset", 6) == 0;
      auto type = copy ? libkineto::ActivityType::GPU_MEMCPY
                       : fill ? libkineto::ActivityType::GPU_MEMSET : libkineto::ActivityType::CONCURRENT_KERNEL;
      libkineto::GenericTraceActivity act(span, type, r.name);
      act.startTime = r.start_ns;
      act.endTime = r.end_ns;
      act.device = r.device;
      act.resource = static_cast<int32_t>(r.stream);
      act.id = static_cast<int32_t>(r.correlation);
      if (r.correlation != 0) {
        if (linked) act.linked = linked(static_cast<int32_t>(r.correlation));
        act.flow.id = static_cast<uint32_t>(r.correlation);
        act.flow.type = libkineto::kLinkAsyncCpuGpu;
        act.flow.start = 0;
      }
      act.addMetadata("device", r.device);
      act.addMetadata("stream", r.stream);
      act.addMetadata("correlation", r.correlation);
      // A graph replay is one launch: how many recorded kernels it ran.
      if (r.graph_kernels >= 0) act.addMetadata("kernels", r.graph_kernels);
      act.log(logger);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(0, 0, "neuron", "NeuronCore (host runtime)");
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::set<std::pair<int, int64_t>> streams;
    for (const KernelRecord& r : records_) streams.insert({r.device, r.stream});
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [device, stream] : streams) {
      out.push_back(libkineto::ResourceInfo(stream, stream, device,
                                            "neuron:" + std::to_string(device) + " stream " +
                                                std::to_string(stream)));
    }
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

 private:
  int64_t start_ns_ = 0;
  int64_t end_ns_ = 0;
  std::vector<KernelRecord> records_;
};

class NeuronActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return activities_; }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>&,
                                                                 const libkineto::Config&) override {
    return std::make_unique<NeuronProfilerSession>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"neuron"};
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL,
                                                libkineto::ActivityType::GPU_MEMCPY,
                                                libkineto::ActivityType::GPU_MEMSET};
};

REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);

// ---- legacy profiler (torch.autograd.profiler.profile(use_device="neuron")) ----

struct NeuronProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    if (device) *device = static_cast<c10::DeviceIndex>(neuronrt::current_device());
    // Launches complete before they return, so the host clock is the device clock.
    auto t = std::make_shared<int64_t>(unix_ns());
    if (cpu_ns) *cpu_ns = *t;
    *event = std::shared_ptr<void>(t, t.get());
  }
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* a,
                const torch::profiler::impl::ProfilerVoidEventStub* b) const override {
    auto* t0 = static_cast<const int64_t*>(a->get());
    auto* t1 = static_cast<const int64_t*>(b->get());
    return static_cast<float>(*t1 - *t0) / 1000.0f;  // microseconds
  }
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    for (int d = 0; d < neuronrt::device_count(); ++d) op(d);
  }
  void synchronize() const override {
    try {
      for (int d = 0; d < neuronrt::device_count(); ++d) neuronrt::synchronize_device(d);
    } catch (const std::exception&) {  // unusable runtime (bad fork): nothing ran
    }
  }
};

struct RegisterStubs {
  RegisterStubs() {
    static NeuronProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} g_register_stubs;

}  // namespace
}  // namespace torch_neuronx
