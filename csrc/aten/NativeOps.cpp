// Kernels that must not go through host execution: allocation, metadata and
// views (they only describe device memory), copies across the device
// boundary, host reads (sync points) and stream bookkeeping.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "Fidelity.h"
#include "HostExecution.h"
#include "NeuronAllocator.h"
#include "NeuronFunctions.h"
#include "OpTracking.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {

// Grows, shrinks or releases a storage's device memory, keeping its prefix.
void resize_storage_bytes(c10::StorageImpl* impl, size_t newsize);

namespace {

c10::Device target_device(std::optional<c10::Device> device) {
  lazy_init();
  c10::DeviceIndex index = device && device->has_index() ? device->index() : -1;
  return device_of_index(resolve_device(index));
}

// The dtype of a neuron factory's result, after the checks every factory makes.
c10::ScalarType factory_dtype(std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                              std::optional<bool> pin_memory) {
  auto scalar_type = c10::dtype_or_default(dtype);
  check_supported_dtype(scalar_type);
  check_strict_dtype(scalar_type, "a neuron tensor");
  TORCH_CHECK(c10::layout_or_default(layout) == c10::kStrided, "neuron supports only strided tensors");
  // Pinning is a property of host memory (as on CUDA).
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  return scalar_type;
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  c10::Device dev = target_device(device);
  AllocationContext context;
  auto scalar_type = factory_dtype(dtype, layout, pin_memory);
  c10::DeviceGuard guard(dev);
  return at::detail::empty_generic(size, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   scalar_type, memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  c10::Device dev = target_device(device);
  AllocationContext context;
  auto scalar_type = factory_dtype(dtype, layout, pin_memory);
  c10::DeviceGuard guard(dev);
  return at::detail::empty_strided_generic(size, stride, device_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), scalar_type);
}

// A zero tensor has no memory: the ZeroTensor key makes every op read zeros.
at::Tensor efficientzerotensor(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory) {
  c10::Device dev = target_device(device);
  auto scalar_type = c10::dtype_or_default(dtype);
  check_supported_dtype(scalar_type);
  at::native::ZeroTensorAllocator allocator(dev);
  auto keys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1) | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor);
  return at::detail::empty_generic(size, &allocator, keys, scalar_type, std::nullopt);
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  lazy_init();
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  lazy_init();
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  lazy_init();
  return at::native::_reshape_alias(self, size, stride);
}

void ensure_storage(const at::Tensor& self, size_t needed) {
  c10::StorageImpl* storage = self.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) {
    c10::DeviceGuard guard(self.device());
    resize_storage_bytes(storage, needed);
  }
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (impl->numel() > 0) {
    ensure_storage(self, at::detail::computeStorageNbytesContiguous(size, self.dtype().itemsize(),
                                                                    self.storage_offset()));
  }
  if (memory_format) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve, "Unsupported memory format ", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  TORCH_CHECK(source.device() == self.device(), "Attempted to set the storage of a tensor on device \"",
              self.device(), "\" to a storage on different device \"", source.device(), "\".");
  auto* impl = self.unsafeGetTensorImpl();
  if (impl->storage().unsafeGetStorageImpl() != source.unsafeGetStorageImpl()) {
    impl->set_storage_keep_dtype(std::move(source));
  }
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(storage_offset);
  } else {
    impl->set_sizes_and_strides(size, stride, storage_offset);
  }
  if (impl->numel() > 0) {
    ensure_storage(self, at::detail::computeStorageNbytes(impl->sizes(), impl->strides(),
                                                          self.dtype().itemsize(), storage_offset));
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

// copy_ across the device boundary (and between neuron tensors): both sides
// are host-addressable, so the copy is one CPU copy_ between aliases, which
// also converts dtypes and handles any strides. The aliases keep the conj and
// neg bits of both sides, so the CPU copy resolves them (see the fallthrough
// registrations below).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  lazy_init();
  const at::Tensor& dev = dst.device().type() == c10::DeviceType::PrivateUse1 ? dst : self;
  if (dst.numel() == 0) return dst;
  check_supported_dtype(self.scalar_type());
  if (dev.is_same(dst)) check_strict_dtype(self.scalar_type(), "a copy to neuron");
  if (self._is_zerotensor()) {  // no storage behind it
    dst.zero_();
    return dst;
  }
  neuronrt::Stream& stream = rt_call([&]() -> neuronrt::Stream& { return neuronrt::current_stream(dev.device().index()); });
  if (self.is_privateuseone() && dst.is_privateuseone() && self.device() != dst.device()) {
    // The copy runs in order on the destination's stream: the source's
    // producers, queued on its own device, must have run first.
    rt_call([&] { neuronrt::current_stream(self.device().index()).synchronize(); });
  }
  // Device-to-device copies and non_blocking copies from/to pinned memory
  // are queued; other host copies run when the stream reaches them.
  const bool pinned = non_blocking && (self.is_privateuseone() ? dst : self).is_pinned();
  // Conversions the CPU copy refuses (bit types) or warns about (complex to
  // real) stay synchronous, so that the error or warning reaches the caller.
  const bool checked = self.scalar_type() == dst.scalar_type() ||
                       (!c10::isBitsType(self.scalar_type()) && !c10::isBitsType(dst.scalar_type()) &&
                        !(self.is_complex() && !dst.is_complex()));
  // "Memcpy" names read as copies in the profiler (kineto's GPU_MEMCPY).
  const char* name = !self.is_privateuseone() ? "Memcpy HtoD" : !dst.is_privateuseone() ? "Memcpy DtoH" : "Memcpy DtoD";
  if (checked && ((self.is_privateuseone() && dst.is_privateuseone()) || pinned)) {
    copy_async(self, dst, stream, name);
    return dst;
  }
  if (stream.is_capturing() && !dst.is_privateuseone()) {
    rt_call([&] {
      stream.capture_violation("a copy to the host (.cpu(), .tolist(), .numpy(), printing) would read values that "
                               "are computed only at replay");
    });
  }
  if (stream.is_capturing() && !self.is_privateuseone()) {
    // Only a queued copy can be recorded (docs/graphs.md, "Copies").
    rt_call([&] {
      stream.capture_violation("a copy from pageable host memory (torch.tensor(data, device=...), .to() of a CPU "
                               "tensor) runs synchronously and cannot be captured: create the tensor before the "
                               "capture, or copy_ from pinned memory with non_blocking=True (each replay copies "
                               "from that pinned buffer again)");
    });
  }
  at::Tensor src_h = host_alias(self);
  at::Tensor dst_h = host_alias(dst);
  auto body = [&] { dst_h.copy_(src_h, non_blocking); };
  rt_call([&] { stream.launch(std::ref(body), name); });
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) at::native::resize_output(dst, self.sizes());
  return copy_from(self, dst, false);
}

// .item(), bool(t), printing: a host read, so it waits for the stream.
c10::Scalar local_scalar_dense(const at::Tensor& self) {
  lazy_init();
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(), " elements cannot be converted to Scalar");
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  rt_call([&] {
    neuronrt::Stream& stream = neuronrt::current_stream(self.device().index());
    if (stream.is_capturing()) {
      stream.capture_violation(".item() (or bool(t), printing) would read on the host a value that is computed "
                               "only at replay");
    }
    neuronrt::memcpy(host.mutable_data_ptr(), self.const_data_ptr(), self.dtype().itemsize(),
                     neuronrt::MemcpyKind::DeviceToHost, stream);
  });
  host._set_conj(self.is_conj());
  host._set_neg(self.is_neg());
  return at::_local_scalar_dense(host.resolve_conj().resolve_neg());
}

// param.data = t.to("neuron") and Module._apply swap a CPU TensorImpl for a
// neuron one; both are dense strided host-addressable tensors.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && (t.device().is_cpu() || t.device().is_privateuseone());
  };
  if (dense(self) && dense(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

// Freed blocks are reusable at once (launches complete in order).
void record_stream(at::Tensor&, c10::Stream) {}

}  // namespace

void resize_storage_bytes(c10::StorageImpl* impl, size_t newsize) {
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  size_t old = impl->nbytes();
  if (newsize == old) return;
  c10::DataPtr fresh;
  if (newsize > 0) {
    c10::DeviceGuard guard(impl->device());
    fresh = device_allocator()->allocate(newsize);
    if (old > 0 && impl->data()) {
      rt_call([&] {
        neuronrt::memcpy(fresh.get(), impl->data(), std::min(old, newsize), neuronrt::MemcpyKind::DeviceToDevice,
                         neuronrt::current_stream(impl->device().index()));
      });
    }
  } else {
    fresh = c10::DataPtr(nullptr, impl->device());
  }
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(newsize);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_efficientzerotensor", efficientzerotensor);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("_copy_from", &Noted<at::_ops::_copy_from, copy_from>::call);
  m.impl("_copy_from_and_resize", &Noted<at::_ops::_copy_from_and_resize, copy_from_and_resize>::call);
  m.impl("_local_scalar_dense", &Noted<at::_ops::_local_scalar_dense, local_scalar_dense>::call);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("record_stream", record_stream);
}

// _copy_from is the device copy itself, and copy_from above honours the conj,
// neg and zero bits. Left to the Conjugate/Negative/ZeroTensor fallbacks, it
// would materialize its source with clone(), i.e. copy_(), i.e. _copy_from
// again: unbounded recursion. (copy_ and clone fall through for the same reason.)
static void copies_fall_through(torch::Library& m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Conjugate, m) { copies_fall_through(m); }
TORCH_LIBRARY_IMPL(aten, Negative, m) { copies_fall_through(m); }
TORCH_LIBRARY_IMPL(aten, ZeroTensor, m) { copies_fall_through(m); }

}  // namespace at::neuron
