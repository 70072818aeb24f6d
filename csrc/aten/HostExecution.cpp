#include "HostExecution.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/SmallVector.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "Fidelity.h"
#include "NeuronAllocator.h"
#include "NeuronFunctions.h"
#include "NeuronGenerator.h"
#include "OpTracking.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {
namespace {

constexpr auto kNeuron = c10::DeviceType::PrivateUse1;

// DataPtr deleter whose context is a StorageImpl kept alive by the pointer.
void release_storage_ref(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

c10::DataPtr borrow(c10::StorageImpl* owner, c10::Device device) {
  c10::raw::intrusive_ptr::incref(owner);
  return c10::DataPtr(owner->mutable_data(), owner, &release_storage_ref, device);
}

// A CPU storage over the bytes of device storage `orig`, keeping it alive.
// `resizable`: a kernel may resize it (an out= argument), from the CPU
// allocator, i.e. from HBM while staging.
c10::Storage host_storage(c10::StorageImpl* orig, bool resizable) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), orig->nbytes(), borrow(orig, c10::Device(c10::kCPU)),
      resizable ? c10::GetCPUAllocator() : nullptr, resizable));
}

bool is_neuron(const at::Tensor& t) { return t.defined() && t.device().type() == kNeuron; }

at::Tensor make_like(c10::Storage storage, c10::DispatchKey key, const at::Tensor& meta) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), meta.dtype());
  auto* impl = t.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(meta.sizes(), meta.strides(), meta.storage_offset());
  if (meta.is_neg()) impl->_set_neg(true);
  if (meta.is_conj()) impl->_set_conj(true);
  if (meta._is_zerotensor()) impl->_set_zero(true);
  return t;
}

int64_t max_numel(const torch::jit::Stack& stack, size_t begin) {
  int64_t n = 1;
  for (size_t i = begin; i < stack.size(); ++i) {
    for_each_tensor(stack[i], [&](const at::Tensor& t, bool) { n = std::max(n, t.numel()); });
  }
  return n;
}

// One op invocation on the host runtime, in the steps of host_execute:
// check, (queue), alias, launch, adopt. Device memory is viewed as host
// memory for the kernel and its results are mapped back.
class HostCall {
 public:
  HostCall(const c10::OperatorHandle& op, torch::jit::Stack* stack)
      : op_(op), schema_(op.schema()), stack_(*stack),
        args_begin_(stack->size() - schema_.arguments().size()) {}

  // Finds the device and rejects device mixes (and, in strict mode, dtypes
  // the target lacks) before anything is touched.
  void check() {
    bool has_cpu = false;
    for (size_t i = 0; i < schema_.arguments().size(); ++i) {
      const c10::IValue& iv = stack_[args_begin_ + i];
      const c10::AliasInfo* alias = schema_.arguments()[i].alias_info();
      const bool written = alias && alias->isWrite();
      if (iv.isDevice()) note_device(iv.toDevice());
      for_each_tensor(iv, [&](const at::Tensor& t, bool in_index_list) {
        if (t.defined()) note_device(t.device());
        // A 0-dim CPU tensor read by the op is a scalar, and CPU indices may
        // index device tensors (as on CUDA); anything else, and any CPU
        // tensor the op writes (out=, in-place self), is a device mix.
        if (t.defined() && t.device().is_cpu() && (written || (t.dim() > 0 && !in_index_list))) has_cpu = true;
        if (is_neuron(t) && !in_index_list) check_strict_dtype(t.scalar_type(), schema_.name());
      });
    }
    TORCH_CHECK(!(has_cpu && device_), "Expected all tensors to be on the same device, but found at least two "
                "devices, ", *device_, " and cpu! (in ", schema_.name(), ")");
    check_device(device_index());
  }

  c10::DeviceIndex device_index() const { return device_ ? device_->index() : current_device(); }

  // Replaces device tensors by host aliases and neuron devices by the CPU,
  // and picks the generator a random op draws from.
  void alias() {
    for (size_t i = 0; i < schema_.arguments().size(); ++i) {
      c10::IValue& iv = stack_[args_begin_ + i];
      if (iv.isDevice() && iv.toDevice().type() == kNeuron) {
        iv = c10::Device(c10::kCPU);
      } else if (is_generator_type(schema_.arguments()[i].type())) {
        generator_args_.push_back(&iv);
        gen_ = iv.isNone() ? default_generator(device_index()) : iv.toGenerator();
        TORCH_CHECK(gen_.device().type() == kNeuron, "Expected a 'neuron' device type for generator but found '",
                    gen_.device().type(), "'");
      } else {
        iv = map_tensors(std::move(iv), [&](const at::Tensor& t) { return to_host(t); });
      }
    }
    // Ops without a Generator argument (native_dropout, ...) draw from the
    // CPU default generator inside their CPU kernel.
    implicit_ = !gen_.defined() && draws_implicitly(op_, &stack_[args_begin_]);
    if (implicit_) gen_ = default_generator(device_index());
    // A neuron generator alone (no neuron tensor or device among the
    // arguments) routes a CPU op here: refuse it as CUDA does.
    TORCH_CHECK(!gen_.defined() || device_, "Expected a 'cpu' device type for generator but found '",
                gen_.device(), "' (in ", schema_.name(), ")");
  }

  // Runs the kernel in a launch on the device's current stream; memory it
  // allocates comes from HBM (staging), random ops draw through the bridge.
  void launch() {
    const c10::DeviceIndex device = device_index();
    c10::DeviceGuard guard(device_of_index(device));
    std::optional<GeneratorBridge> rng;
    if (gen_.defined()) rng.emplace(gen_.get<NeuronGeneratorImpl>(), implicit_, generator_args_);
    staging_.emplace(device);
    rt_call([&] {
      neuronrt::current_stream(device).launch([&] { run_host_kernel(op_, &stack_); }, schema_.name().c_str());
    });
    staging_->end();
    if (rng) rng->finish(static_cast<uint64_t>(max_numel(stack_, stack_.size() - schema_.returns().size())));
  }

  // Carries kernel-side changes of the arguments back to them and maps the
  // results to neuron tensors.
  void adopt() {
    sync_arguments();
    const size_t rets_begin = stack_.size() - schema_.returns().size();
    if (strict_mode()) check_strict_results(rets_begin);
    for (size_t i = rets_begin; i < stack_.size(); ++i) {
      if (stack_[i].isTensor() || stack_[i].isTensorList()) {
        stack_[i] = map_tensors(std::move(stack_[i]), [&](const at::Tensor& t) { return to_device(t); });
      }
    }
  }

 private:
  struct Alias {
    c10::StorageImpl* orig;
    c10::Storage alias;
    const void* orig_data;
  };

  void note_device(c10::Device d) {
    if (d.type() != kNeuron) return;
    if (!d.has_index()) d = device_of_index(current_device());  // device="neuron"
    if (!device_) {
      device_ = d;
    } else if (*device_ != d) {
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                  *device_, " and ", d, "! (in ", schema_.name(), ")");
    }
  }

  at::Tensor to_host(const at::Tensor& t) {
    if (!is_neuron(t)) return t;
    c10::StorageImpl* orig = t.storage().unsafeGetStorageImpl();
    Alias* a = alias_of(orig);
    if (!a) a = &aliases_.emplace_back(Alias{orig, host_storage(orig, /*resizable=*/true), orig->data()});
    at::Tensor host = make_like(a->alias, c10::DispatchKey::CPU, t);
    args_.emplace_back(host, t);
    return host;
  }

  Alias* alias_of(c10::StorageImpl* orig) {
    for (auto& a : aliases_) {
      if (a.orig == orig) return &a;
    }
    return nullptr;
  }

  // Maps a kernel result back to the device.
  at::Tensor to_device(const at::Tensor& host) {
    if (!host.defined() || !host.device().is_cpu()) return host;
    for (auto& [h, orig] : args_) {
      if (h.unsafeGetTensorImpl() == host.unsafeGetTensorImpl()) return orig;  // in-place result
    }
    check_supported_dtype(host.scalar_type());
    return make_like(adopt_storage(host.storage()), c10::DispatchKey::PrivateUse1, host);
  }

  // Carries kernel-side changes of arguments (resize, set_) back to them.
  void sync_arguments() {
    c10::Device device = device_of_index(device_index());
    for (auto& a : aliases_) {
      c10::StorageImpl* alias = a.alias.unsafeGetStorageImpl();
      if (alias->data() == a.orig_data && alias->nbytes() == a.orig->nbytes()) continue;
      // The kernel resized the storage: its new buffer came from the staging
      // allocator, i.e. from HBM, so the device storage adopts it.
      TORCH_INTERNAL_ASSERT(alias->nbytes() == 0 || staging_->kind_of(*alias) == StorageKind::Staged,
                            "resized storage is not device memory");
      a.orig->set_data_ptr_noswap(borrow(alias, device));
      a.orig->set_nbytes(alias->nbytes());
      a.orig_data = alias->data();
    }
    for (auto& [host, orig] : args_) {
      c10::TensorImpl* h = host.unsafeGetTensorImpl();
      c10::TensorImpl* o = orig.unsafeGetTensorImpl();
      Alias* a = alias_of(o->storage().unsafeGetStorageImpl());
      if (!a || h->storage().unsafeGetStorageImpl() != a->alias.unsafeGetStorageImpl()) {
        o->set_storage_keep_dtype(adopt_storage(h->storage()));
      }
      if (h->sizes() != o->sizes() || h->strides() != o->strides() || h->storage_offset() != o->storage_offset()) {
        o->set_sizes_and_strides(h->sizes(), h->strides(), h->storage_offset());
      }
    }
  }

  // The device storage backing host storage `s`, the one place host memory
  // becomes device memory: the original of an alias, else by its kind.
  c10::Storage adopt_storage(const c10::Storage& s) {
    c10::StorageImpl* impl = s.unsafeGetStorageImpl();
    for (auto& a : aliases_) {
      if (a.alias.unsafeGetStorageImpl() == impl && impl->data() == a.orig_data) {
        return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(a.orig));
      }
    }
    for (auto& [host, dev] : adopted_) {
      if (host == impl) return dev;
    }
    c10::Device device = device_of_index(device_index());
    c10::Storage dev;
    switch (staging_->kind_of(*impl)) {
      case StorageKind::Device:
        dev = s;
        break;
      case StorageKind::NoMemory:
        dev = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
            c10::StorageImpl::use_byte_size_t(), impl->nbytes(), c10::DataPtr(nullptr, device), nullptr, false));
        break;
      case StorageKind::Staged:
        // HBM referenced only by this kernel's results: the storage itself
        // becomes device storage.
        impl->mutable_data_ptr().unsafe_set_device(device);
        impl->set_allocator(device_allocator());
        dev = s;
        break;
      case StorageKind::Host: {
        c10::DeviceGuard guard(device);
        dev = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
            c10::StorageImpl::use_byte_size_t(), impl->nbytes(), device_allocator(), true));
        if (impl->nbytes() > 0) {
          rt_call([&] {
            neuronrt::memcpy(dev.mutable_data(), impl->data(), impl->nbytes(), neuronrt::MemcpyKind::HostToDevice,
                             neuronrt::current_stream(device.index()));
          });
        }
        break;
      }
    }
    adopted_.emplace_back(impl, dev);
    return dev;
  }

  // Strict mode: the results' dtypes and int64 ranges (Fidelity.h).
  void check_strict_results(size_t rets_begin) {
    for (size_t i = rets_begin; i < stack_.size(); ++i) {
      const auto& iv = stack_[i];
      if (!iv.isTensor() || !iv.toTensor().defined()) continue;
      check_strict_dtype(iv.toTensor().scalar_type(), schema_.name());
      // Computed values only: a view (unfold, diagonal, ...) computes none,
      // and may even show memory its op has yet to fill.
      const c10::AliasInfo* alias = schema_.returns()[i - rets_begin].alias_info();
      if (alias && !alias->isWrite()) continue;
      const auto access = neuronrt::host_access();  // reads the result on the host
      check_strict_int_range(iv.toTensor(), schema_.name());
    }
  }

  const c10::OperatorHandle& op_;
  const c10::FunctionSchema& schema_;
  torch::jit::Stack& stack_;
  const size_t args_begin_;
  std::optional<c10::Device> device_;
  at::Generator gen_;
  bool implicit_ = false;
  c10::SmallVector<c10::IValue*, 1> generator_args_;
  std::optional<StagingScope> staging_;
  // Inline capacity covers nearly all ops without heap allocations.
  c10::SmallVector<Alias, 4> aliases_;
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 6> args_;  // (host alias, original)
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 2> adopted_;
};

}  // namespace

at::Tensor host_alias(const at::Tensor& t) {
  if (!is_neuron(t)) return t;
  return make_like(host_storage(t.storage().unsafeGetStorageImpl(), /*resizable=*/false), c10::DispatchKey::CPU, t);
}

std::vector<c10::IValue> host_call(const char* name, const char* overload, std::vector<c10::IValue> args) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, std::string>, c10::OperatorHandle> cache;
  c10::OperatorHandle op = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    auto key = std::make_pair(std::string(name), std::string(overload));
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, c10::Dispatcher::singleton().findSchemaOrThrow(name, overload)).first;
    return it->second;
  }();
  torch::jit::Stack stack(std::make_move_iterator(args.begin()), std::make_move_iterator(args.end()));
  host_execute(op, &stack);
  return stack;
}

bool draws_implicitly(const c10::OperatorHandle& op, const c10::IValue* args) {
  if (!op.hasTag(at::Tag::nondeterministic_seeded)) return false;
  const auto dropout = op.schema().argumentIndexWithName("dropout_p");
  return !(dropout && args[*dropout].isDouble() && args[*dropout].toDouble() == 0.0);
}

void check_supported_dtype(c10::ScalarType dtype) {
  // Complex types run on the host runtime (models such as DeepSeek-V2 and
  // Llama 4 write rotary embeddings with them); quantized types have no kernels.
  TORCH_CHECK_TYPE(!c10::isQIntType(dtype),
                   "neuron devices do not support the dtype ", dtype,
                   " (supported: floating point, complex, integer and bool types)");
}

void host_execute(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  lazy_init();
  AllocationContext context;  // labels this op's allocations (memory history)
  HostCall call(op, stack);
  call.check();
  if (launch_async(op, stack, call.device_index())) return;  // queued
  if (record_in_capture(op, stack, call.device_index())) return;  // recorded in a graph
  call.alias();
  call.launch();
  call.adopt();
}

// ---- fallback ---------------------------------------------------------------

namespace {
bool fallback_disabled() {
  static const bool disabled = [] {
    const char* v = std::getenv("TORCH_NEURONX_DISABLE_FALLBACK");
    return v && *v && std::string(v) != "0";
  }();
  return disabled;
}

// Same spelling as torch_neuronx.supported_ops(): "add.Tensor", "mm".
std::string short_name(const c10::OperatorName& name) {
  std::string base = name.name.rfind("aten::", 0) == 0 ? name.name.substr(6) : name.name;
  return name.overload_name.empty() ? base : base + "." + name.overload_name;
}
}  // namespace

void host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  note_executed(op.schema().name().c_str());
  host_execute(op, stack);
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  TORCH_CHECK_NOT_IMPLEMENTED(!fallback_disabled(), "The operator '", short_name(name),
                              "' has no neuron kernel, and TORCH_NEURONX_DISABLE_FALLBACK=1 forbids the host "
                              "fallback.");
  if (note_fallback(name)) {
    TORCH_WARN("The operator '", short_name(name), "' has no neuron kernel; it runs through the host fallback "
               "(counted in torch_neuronx.fallback_report(), listed by get_fallback_ops()).");
  }
  host_execute(op, stack);
}

std::map<std::string, int64_t> fallback_counts() {
  std::map<std::string, int64_t> counts;
  for (const auto& [name, calls] : fallback_ops()) {
    counts[name.rfind("aten::", 0) == 0 ? name.substr(6) : name] = calls;
  }
  return counts;
}

void reset_fallback_counts() { clear_fallback_ops(); }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

}  // namespace at::neuron
