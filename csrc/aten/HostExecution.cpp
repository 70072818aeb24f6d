#include "HostExecution.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
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

// Copies host storage `src` into freshly allocated device storage `dst`.
void copy_to_device(c10::Storage& dst, const c10::StorageImpl& src) {
  if (src.nbytes() == 0) return;
  rt_call([&] {
    neuronrt::memcpy(dst.mutable_data(), src.data(), src.nbytes(), neuronrt::MemcpyKind::HostToDevice,
                     neuronrt::current_stream(dst.device().index()));
  });
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

// One op invocation's view of device memory as host memory.
class HostCall {
 public:
  explicit HostCall(const c10::OperatorHandle& op) : op_(op) {}

  void note_device(c10::Device d) {
    if (d.type() != kNeuron) return;
    if (!d.has_index()) d = device_of_index(current_device());  // device="neuron"
    if (!device_) {
      device_ = d;
    } else if (*device_ != d) {
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                  *device_, " and ", d, "! (in ", op_.schema().name(), ")");
    }
  }
  void note_cpu_tensor(const at::Tensor& t, bool in_index_list, bool written) {
    // A 0-dim CPU tensor read by the op is a scalar, and CPU indices may
    // index device tensors (as on CUDA); anything else, and any CPU tensor
    // the op writes (out=, in-place self), is a device mix.
    if (t.defined() && t.device().is_cpu() && (written || (t.dim() > 0 && !in_index_list))) has_cpu_ = true;
  }
  void check_mix() const {
    TORCH_CHECK(!(has_cpu_ && device_), "Expected all tensors to be on the same device, but found at least two "
                "devices, ", *device_, " and cpu! (in ", op_.schema().name(), ")");
  }
  c10::DeviceIndex device_index() const { return device_ ? device_->index() : current_device(); }
  bool has_device() const { return device_.has_value(); }

  at::Tensor to_host(const at::Tensor& t) {
    if (!is_neuron(t)) return t;
    c10::StorageImpl* orig = t.storage().unsafeGetStorageImpl();
    c10::Storage* alias = nullptr;
    for (auto& a : aliases_) {
      if (a.orig == orig) alias = &a.alias;
    }
    if (!alias) {
      auto impl = c10::make_intrusive<c10::StorageImpl>(
          c10::StorageImpl::use_byte_size_t(), orig->nbytes(), borrow(orig, c10::Device(c10::kCPU)),
          c10::GetCPUAllocator(), /*resizable=*/true);
      aliases_.push_back({orig, c10::Storage(std::move(impl)), orig->data()});
      alias = &aliases_.back().alias;
    }
    at::Tensor host = make_like(*alias, c10::DispatchKey::CPU, t);
    args_.emplace_back(host, t);
    return host;
  }

  // Maps a kernel result back to the device.
  at::Tensor to_device(const at::Tensor& host) {
    if (!host.defined() || !host.device().is_cpu()) return host;
    for (auto& [h, orig] : args_) {
      if (h.unsafeGetTensorImpl() == host.unsafeGetTensorImpl()) return orig;  // in-place result
    }
    check_supported_dtype(host.scalar_type());
    return make_like(device_storage(host.storage()), c10::DispatchKey::PrivateUse1, host);
  }

  // Carries kernel-side changes of arguments (resize, set_) back to them.
  void sync_arguments() {
    c10::Device device = device_of_index(device_index());
    for (auto& a : aliases_) {
      c10::StorageImpl* alias = a.alias.unsafeGetStorageImpl();
      if (alias->data() == a.orig_data && alias->nbytes() == a.orig->nbytes()) continue;
      // The kernel resized the storage. Its new buffer came from the staging
      // allocator, i.e. from HBM, so the device storage adopts it.
      TORCH_INTERNAL_ASSERT(alias->nbytes() == 0 || alias->data_ptr().get_deleter() == &device_free,
                            "resized storage is not device memory");
      a.orig->set_data_ptr_noswap(borrow(alias, device));
      a.orig->set_nbytes(alias->nbytes());
      a.orig_data = alias->data();
    }
    for (auto& [host, orig] : args_) {
      c10::TensorImpl* h = host.unsafeGetTensorImpl();
      c10::TensorImpl* o = orig.unsafeGetTensorImpl();
      if (h->storage().unsafeGetStorageImpl() != alias_of(o->storage().unsafeGetStorageImpl())) {
        o->set_storage_keep_dtype(device_storage(h->storage()));
      }
      if (h->sizes() != o->sizes() || h->strides() != o->strides() || h->storage_offset() != o->storage_offset()) {
        o->set_sizes_and_strides(h->sizes(), h->strides(), h->storage_offset());
      }
    }
  }

 private:
  struct Alias {
    c10::StorageImpl* orig;
    c10::Storage alias;
    const void* orig_data;
  };

  c10::StorageImpl* alias_of(c10::StorageImpl* orig) {
    for (auto& a : aliases_) {
      if (a.orig == orig) return a.alias.unsafeGetStorageImpl();
    }
    return nullptr;
  }

  // The device storage backing host storage `s`: the original of an alias,
  // or a device storage adopting (or, failing that, copying) fresh memory.
  c10::Storage device_storage(const c10::Storage& s) {
    c10::StorageImpl* impl = s.unsafeGetStorageImpl();
    for (auto& a : aliases_) {
      if (a.alias.unsafeGetStorageImpl() == impl && impl->data() == a.orig_data) {
        return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(a.orig));
      }
    }
    for (auto& [host, dev] : fresh_) {
      if (host == impl) return dev;
    }
    c10::Device device = device_of_index(device_index());
    c10::Storage dev;
    if (!impl->data() && impl->nbytes() > 0) {
      // No memory behind it (ZeroTensor): nothing to adopt or copy.
      dev = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
          c10::StorageImpl::use_byte_size_t(), impl->nbytes(), c10::DataPtr(nullptr, device), nullptr, false));
    } else if (impl->data_ptr().get_deleter() == &device_free) {
      // Allocated in HBM under the StagingScope and referenced only by this
      // kernel's results: the storage itself becomes device storage.
      impl->mutable_data_ptr().unsafe_set_device(device);
      impl->set_allocator(device_allocator());
      dev = s;
    } else {
      // Host memory from elsewhere (e.g. an intra-op worker thread): copy.
      c10::DeviceGuard guard(device);
      dev = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
          c10::StorageImpl::use_byte_size_t(), impl->nbytes(), device_allocator(), true));
      copy_to_device(dev, *impl);
    }
    fresh_.emplace_back(impl, dev);
    return dev;
  }

  const c10::OperatorHandle& op_;
  std::optional<c10::Device> device_;
  bool has_cpu_ = false;
  // Inline capacity covers nearly all ops without heap allocations.
  c10::SmallVector<Alias, 4> aliases_;
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 6> args_;  // (host alias, original)
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 2> fresh_;
};

bool is_generator_arg(const c10::Argument& arg) {
  auto t = arg.type();
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  return t->kind() == c10::TypeKind::GeneratorType;
}

// In philox mode, a CPU generator that draws from the neuron generator's
// Philox stream: seeded from philox(seed, offset), so a given (seed, offset)
// always yields the same values and get/set_offset select streams as on other
// accelerators.
at::Generator bridge_generator(uint64_t seed, uint64_t offset) {
  auto r = neuronrt::philox4x32(seed, offset >> 2, /*subsequence=*/0x6e6575726f6eULL);
  uint64_t mixed = (static_cast<uint64_t>(r[1]) << 32) | r[0];
  return at::make_generator<at::CPUGeneratorImpl>(mixed);
}

int64_t max_numel(const torch::jit::Stack& stack, size_t begin) {
  int64_t n = 1;
  for (size_t i = begin; i < stack.size(); ++i) {
    const auto& iv = stack[i];
    if (iv.isTensor()) n = std::max(n, iv.toTensor().numel());
    else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorList()) n = std::max(n, t.numel());
    }
  }
  return n;
}

}  // namespace

at::Tensor host_alias(const at::Tensor& t) {
  if (!is_neuron(t)) return t;
  c10::StorageImpl* orig = t.storage().unsafeGetStorageImpl();
  c10::Storage alias(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), orig->nbytes(),
                                                           borrow(orig, c10::Device(c10::kCPU)), nullptr, false));
  return make_like(std::move(alias), c10::DispatchKey::CPU, t);
}

at::Tensor device_tensor(const at::Tensor& host, c10::DeviceIndex device) {
  if (!host.defined() || !host.device().is_cpu()) return host;
  check_supported_dtype(host.scalar_type());
  c10::StorageImpl* impl = host.storage().unsafeGetStorageImpl();
  const c10::DataPtr& dp = impl->data_ptr();
  c10::Device dev = device_of_index(device);
  c10::Storage storage;
  if (dp.get_deleter() == &release_storage_ref &&
      static_cast<c10::StorageImpl*>(dp.get_context())->device().type() == kNeuron) {
    storage = c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(
        static_cast<c10::StorageImpl*>(dp.get_context())));
  } else if (dp.get_deleter() == &device_free) {
    storage = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), impl->nbytes(), borrow(impl, dev), device_allocator(), true));
  } else {
    c10::DeviceGuard guard(dev);
    storage = c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                                                 impl->nbytes(), device_allocator(), true));
    copy_to_device(storage, *impl);
  }
  return make_like(std::move(storage), c10::DispatchKey::PrivateUse1, host);
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

void check_supported_dtype(c10::ScalarType dtype) {
  // Complex types run on the host runtime (models such as DeepSeek-V2 and
  // Llama 4 write rotary embeddings with them); quantized types have no kernels.
  TORCH_CHECK_TYPE(!c10::isQIntType(dtype),
                   "neuron devices do not support the dtype ", dtype,
                   " (supported: floating point, complex, integer and bool types)");
}

void host_execute(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t args_begin = stack->size() - num_args;
  HostCall call(op);

  lazy_init();
  AllocationContext context;  // labels this op's allocations (memory history)
  // Pass 1: find the device and reject device mixes before touching anything.
  for (size_t i = 0; i < num_args; ++i) {
    auto& iv = (*stack)[args_begin + i];
    const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
    const bool written = alias && alias->isWrite();
    if (iv.isTensor()) {
      const at::Tensor& t = iv.toTensor();
      if (t.defined()) call.note_device(t.device());
      call.note_cpu_tensor(t, false, written);
      if (is_neuron(t)) check_strict_dtype(t.scalar_type(), schema.name());
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorList()) {
        call.note_device(t.device());
        call.note_cpu_tensor(t, false, written);
        if (is_neuron(t)) check_strict_dtype(t.scalar_type(), schema.name());
      }
    } else if (iv.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : iv.toOptionalTensorList()) {
        if (t && t->defined()) {
          call.note_device(t->device());
          call.note_cpu_tensor(*t, true, written);
        }
      }
    } else if (iv.isDevice()) {
      call.note_device(iv.toDevice());
    }
  }
  call.check_mix();
  const c10::DeviceIndex device = call.device_index();
  check_device(device);
  if (launch_async(op, stack, device)) return;

  // Pass 2: alias device memory as host tensors, route devices and RNG.
  at::Generator neuron_gen;
  for (size_t i = 0; i < num_args; ++i) {
    auto& iv = (*stack)[args_begin + i];
    if (iv.isTensor()) {
      iv = call.to_host(iv.toTensor());
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) list[j] = call.to_host(list[j]);
      iv = list;
    } else if (iv.isOptionalTensorList()) {
      auto list = iv.toOptionalTensorList();
      for (size_t j = 0; j < list.size(); ++j) {
        std::optional<at::Tensor> t = list[j];
        if (t) list[j] = call.to_host(*t);
      }
      iv = list;
    } else if (iv.isDevice() && iv.toDevice().type() == kNeuron) {
      iv = c10::Device(c10::kCPU);
    } else if (is_generator_arg(schema.arguments()[i])) {
      neuron_gen = iv.isNone() ? default_generator(device) : iv.toGenerator();
      TORCH_CHECK(neuron_gen.device().type() == kNeuron, "Expected a 'neuron' device type for generator but found '",
                  neuron_gen.device().type(), "'");
    }
  }

  // Random ops draw from the device's generator (NeuronGenerator.h). Ops
  // without a Generator argument (native_dropout, ...) draw from the CPU
  // default generator inside their CPU kernel, which is the default neuron
  // generator's engine in cpu mode.
  const bool implicit = !neuron_gen.defined() && op.hasTag(at::Tag::nondeterministic_seeded);
  if (implicit) neuron_gen = default_generator(device);

  // A neuron generator alone (no neuron tensor or device among the
  // arguments) routes a CPU op here: refuse it as CUDA does.
  TORCH_CHECK(!neuron_gen.defined() || call.has_device(), "Expected a 'cpu' device type for generator but found '",
              neuron_gen.device(), "' (in ", schema.name(), ")");

  c10::DeviceGuard guard(device_of_index(device));
  // Held across the kernel, so that draws and offsets stay in program order;
  // the kernel itself locks the engine it draws from.
  std::unique_lock<std::mutex> gen_lock;
  NeuronGeneratorImpl* gen = nullptr;
  // The CPU default generator, swapped to the Philox bridge for the call.
  struct RestoreCpuDefault {
    std::optional<at::Generator> gen;
    at::Tensor state;
    ~RestoreCpuDefault() {
      if (!gen) return;
      std::lock_guard<std::mutex> lock(gen->mutex());
      gen->set_state(state);
    }
  } cpu_default;
  if (neuron_gen.defined()) {
    gen = neuron_gen.get<NeuronGeneratorImpl>();
    gen_lock = std::unique_lock<std::mutex>(gen->mutex_);
    if (gen->draws_from_engine()) {
      TORCH_INTERNAL_ASSERT(!implicit || gen->shares_cpu_default());
      for (size_t i = 0; i < num_args && !implicit; ++i) {
        if (is_generator_arg(schema.arguments()[i])) (*stack)[args_begin + i] = gen->engine();
      }
    } else if (implicit) {
      // Philox: reseed the CPU default engine from the device generator for
      // the call and restore the caller's CPU RNG state afterwards.
      at::Generator cpu = at::detail::getDefaultCPUGenerator();
      at::Generator seeded = bridge_generator(gen->current_seed(), gen->get_offset());
      std::lock_guard<std::mutex> lock(cpu.mutex());
      cpu_default.state = cpu.get_state();
      cpu.set_state(seeded.get_state());
      cpu_default.gen = cpu;
    } else {
      for (size_t i = 0; i < num_args; ++i) {
        if (is_generator_arg(schema.arguments()[i])) {
          (*stack)[args_begin + i] = bridge_generator(gen->current_seed(), gen->get_offset());
        }
      }
    }
  }

  {
    StagingScope staging(device);
    rt_call([&] {
      neuronrt::current_stream(device).launch(
          [&] { run_host_kernel(op, stack); }, schema.name().c_str());
    });
  }
  if (gen) gen->reserve(static_cast<uint64_t>(max_numel(*stack, stack->size() - schema.returns().size())));

  // Map results back to the device.
  call.sync_arguments();
  const size_t rets_begin = stack->size() - schema.returns().size();
  if (strict_mode()) {
    for (size_t i = rets_begin; i < stack->size(); ++i) {
      const auto& iv = (*stack)[i];
      if (!iv.isTensor() || !iv.toTensor().defined()) continue;
      check_strict_dtype(iv.toTensor().scalar_type(), schema.name());
      // Computed values only: a view (unfold, diagonal, ...) computes none,
      // and may even show memory its op has yet to fill.
      const c10::AliasInfo* alias = schema.returns()[i - rets_begin].alias_info();
      if (alias && !alias->isWrite()) continue;
      const auto access = neuronrt::host_access();  // reads the result on the host
      check_strict_int_range(iv.toTensor(), schema.name());
    }
  }
  for (size_t i = rets_begin; i < stack->size(); ++i) {
    auto& iv = (*stack)[i];
    if (iv.isTensor()) {
      iv = call.to_device(iv.toTensor());
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) list[j] = call.to_device(list[j]);
      iv = list;
    }
  }
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
