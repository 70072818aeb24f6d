// Memory history and snapshots in the format of PyTorch's CUDA snapshots
// (torch.cuda.memory._snapshot()), so torch.cuda._memory_viz and
// pytorch.org/memory_viz render them: the runtime allocator reports its
// events to an observer, which keeps a bounded trace per device and the
// Python stack of each live allocation.
#include <Python.h>
#include <frameobject.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "csrc/aten/NeuronAllocator.h"
#include "csrc/aten/NeuronFunctions.h"
#include "csrc/runtime/Runtime.h"

namespace py = pybind11;

namespace torch_neuronx {
namespace {

struct Frame {
  std::string filename;
  int line;
  std::string name;
};
using Frames = std::shared_ptr<const std::vector<Frame>>;

struct TraceEntry {
  const char* action;
  uintptr_t address;
  size_t size;
  int64_t time_us;
  Frames frames;
};

struct History {
  std::mutex mutex;
  bool enabled = false;
  bool trace = true;         // enabled="all": keep the event trace too
  bool stacks = true;        // context != None: record Python stacks
  size_t max_entries = SIZE_MAX;
  std::vector<std::deque<TraceEntry>> traces;  // per device
  std::unordered_map<uintptr_t, Frames> live;  // allocation stacks
};

History& history() {
  static History* h = new History();  // leaked: allocations outlive shutdown
  return *h;
}

// The calling thread's Python stack, innermost first. Torch's bindings
// release the GIL around ops, so take it back if this thread has a Python
// thread state; called only where no runtime lock is held.
Frames python_stack() {
  auto frames = std::make_shared<std::vector<Frame>>();
  if (!Py_IsInitialized() || _Py_IsFinalizing() || PyGILState_GetThisThreadState() == nullptr) return frames;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyFrameObject* f = PyEval_GetFrame();
  Py_XINCREF(f);
  while (f != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(f);
    frames->push_back({PyUnicode_AsUTF8(code->co_filename), PyFrame_GetLineNumber(f),
                       PyUnicode_AsUTF8(code->co_name)});
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference
    Py_DECREF(f);
    f = back;
  }
  PyGILState_Release(gil);
  return frames;
}

// The stack of the op this thread is running (set by AllocationContext).
thread_local Frames tls_op_stack;
thread_local int tls_op_depth = 0;
std::atomic<bool> g_recording{false};

void context_hook(bool enter) {
  if (enter) {
    if (tls_op_depth++ == 0 && g_recording.load(std::memory_order_relaxed)) tls_op_stack = python_stack();
  } else if (--tls_op_depth == 0) {
    tls_op_stack.reset();
  }
}

int64_t now_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

void observe(const neuronrt::AllocatorEvent& e) {
  using A = neuronrt::AllocatorEvent::Action;
  History& h = history();
  Frames frames;
  if (h.stacks && (e.action == A::Alloc || e.action == A::Oom)) frames = tls_op_stack;
  std::lock_guard<std::mutex> lock(h.mutex);
  if (!h.enabled) return;
  if (e.action == A::Alloc) h.live[e.address] = frames;
  if (e.action == A::Free) h.live.erase(e.address);
  if (!h.trace) return;
  if (static_cast<size_t>(e.device) >= h.traces.size()) h.traces.resize(e.device + 1);
  auto& trace = h.traces[e.device];
  auto push = [&](const char* action) {
    trace.push_back({action, e.address, e.size, now_us(), frames});
    while (trace.size() > h.max_entries) trace.pop_front();
  };
  switch (e.action) {
    case A::Alloc: push("alloc"); break;
    case A::Free:  // freed at once: nothing is pending on a stream
      push("free_requested");
      push("free_completed");
      break;
    case A::SegmentAlloc: push("segment_alloc"); break;
    case A::SegmentFree: push("segment_free"); break;
    case A::Oom: push("oom"); break;
  }
}

py::list frames_list(const Frames& frames) {
  py::list out;
  if (!frames) return out;
  for (const Frame& f : *frames) {
    py::dict d;
    d["filename"] = f.filename;
    d["line"] = f.line;
    d["name"] = f.name;
    out.append(d);
  }
  return out;
}

void record_memory_history(std::optional<std::string> enabled, std::optional<std::string> context,
                           size_t max_entries) {
  TORCH_CHECK(!enabled || *enabled == "all" || *enabled == "state",
              "_record_memory_history: enabled must be None, 'state' or 'all', got '", *enabled, "'");
  TORCH_CHECK(!context || *context == "all" || *context == "alloc" || *context == "state",
              "_record_memory_history: context must be None, 'state', 'alloc' or 'all', got '", *context, "'");
  History& h = history();
  {
    std::lock_guard<std::mutex> lock(h.mutex);
    h.enabled = enabled.has_value();
    h.trace = enabled && *enabled == "all";
    h.stacks = context.has_value();
    h.max_entries = max_entries > 0 ? max_entries : SIZE_MAX;
    if (!h.enabled) {
      h.traces.clear();
      h.live.clear();
    }
  }
  g_recording.store(enabled.has_value() && context.has_value());
  at::neuron::set_allocation_context_hook(enabled ? &context_hook : nullptr);
  neuronrt::set_memory_observer(enabled ? &observe : nullptr);
}

py::dict snapshot() {
  auto blocks = at::neuron::rt_call([] {
    // As memory statistics: blocks of tensors whose last users have run are free.
    return neuronrt::memory_snapshot();
  });
  // Copy what the snapshot needs under the history lock, then build the
  // Python objects without it: building them can run the garbage collector,
  // whose frees of neuron tensors reach observe(), which takes the same lock.
  std::vector<Frames> block_frames(blocks.size());
  std::vector<std::vector<TraceEntry>> device_traces(static_cast<size_t>(neuronrt::device_count()));
  {
    History& h = history();
    std::lock_guard<std::mutex> lock(h.mutex);
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (!blocks[i].in_use) continue;
      auto it = h.live.find(blocks[i].address);
      if (it != h.live.end()) block_frames[i] = it->second;
    }
    for (size_t d = 0; d < device_traces.size() && d < h.traces.size(); ++d) {
      device_traces[d].assign(h.traces[d].begin(), h.traces[d].end());
    }
  }
  // Blocks come by address; a slab's blocks are adjacent and form one segment
  // (its unused tail as one inactive block, so the blocks cover the segment).
  py::list segments;
  for (size_t i = 0; i < blocks.size();) {
    const auto& first = blocks[i];
    const uintptr_t seg_addr = first.segment_size ? first.segment_address : first.address;
    const size_t seg_size = first.segment_size ? first.segment_size : first.size;
    py::list seg_blocks;
    size_t allocated = 0, requested = 0, end = seg_addr;
    for (; i < blocks.size() && blocks[i].address - seg_addr < seg_size; ++i) {
      const auto& b = blocks[i];
      py::dict block;
      block["address"] = b.address;
      block["size"] = b.size;
      block["requested_size"] = b.in_use ? b.requested : 0;
      block["state"] = b.in_use ? "active_allocated" : "inactive";
      block["frames"] = frames_list(block_frames[i]);
      seg_blocks.append(block);
      if (b.in_use) {
        allocated += b.size;
        requested += b.requested;
      }
      end = b.address + b.size;
    }
    if (end < seg_addr + seg_size) {
      py::dict tail;
      tail["address"] = end;
      tail["size"] = seg_addr + seg_size - end;
      tail["requested_size"] = 0;
      tail["state"] = "inactive";
      tail["frames"] = py::list();
      seg_blocks.append(tail);
    }
    py::dict seg;
    seg["device"] = first.device;
    seg["address"] = seg_addr;
    seg["total_size"] = seg_size;
    seg["allocated_size"] = allocated;
    seg["active_size"] = allocated;
    seg["requested_size"] = requested;
    seg["stream"] = 0;
    seg["segment_type"] = first.size <= neuronrt::kSmallPoolLimit ? "small" : "large";
    seg["segment_pool_id"] = py::make_tuple(0, 0);
    seg["is_expandable"] = false;
    seg["frames"] = py::list();
    seg["blocks"] = seg_blocks;
    segments.append(seg);
  }
  py::list traces;
  for (const auto& device_trace : device_traces) {
    py::list trace;
    for (const TraceEntry& e : device_trace) {
      py::dict entry;
      entry["action"] = e.action;
      entry["addr"] = e.address;
      entry["size"] = e.size;
      entry["stream"] = 0;
      entry["time_us"] = e.time_us;
      entry["frames"] = frames_list(e.frames);
      trace.append(entry);
    }
    traces.append(trace);
  }
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = traces;
  py::dict settings;
  settings["PYTORCH_NEURON_ALLOC_CONF"] = "";
  out["allocator_settings"] = settings;
  return out;
}

}  // namespace

void register_memory_snapshot(py::module& m) {
  m.def("_record_memory_history", &record_memory_history, py::arg("enabled"), py::arg("context"),
        py::arg("max_entries"));
  m.def("_memory_snapshot", &snapshot);
  m.def("_set_memory_fraction", [](double fraction, int device) {
    at::neuron::rt_call([&] { neuronrt::set_memory_fraction(device, fraction); });
  });
}

}  // namespace torch_neuronx
