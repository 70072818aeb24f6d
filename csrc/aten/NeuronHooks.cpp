// PrivateUse1HooksInterface: after the rename, torch.accelerator, pinned
// memory, DataLoader pinning, generators and storage resizing all route here
// even when no code names `neuron`, so every hook is real.
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/StorageImpl.h>

#include "NeuronAllocator.h"
#include "NeuronFunctions.h"
#include "NeuronGenerator.h"
#include "NeuronHostAllocator.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {

void resize_storage_bytes(c10::StorageImpl* impl, size_t newsize);  // NativeOps.cpp

namespace {

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return neuronrt::device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex index) const override {
    return index >= 0 && index < neuronrt::device_count();
  }
  void init() const override {}

  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(neuronrt::device_count());
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    rt_call([&] { neuronrt::set_device(device); });
  }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    return static_cast<c10::DeviceIndex>(rt_call([&] { return neuronrt::exchange_device(device); }));
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    if (device < 0 || device >= neuronrt::device_count()) return current_device();
    return exchangeDevice(device);
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return default_generator(device);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override {
    return new_generator(device);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    int device = neuronrt::pointer_device(data);
    TORCH_CHECK(device >= 0, "pointer ", data, " is not neuron device memory");
    return device_of_index(static_cast<c10::DeviceIndex>(device));
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return at::getHostAllocator(at::kPrivateUse1);
  }

  // untyped_storage().resize_(n) and FSDP2's free/realloc of unsharded
  // parameters: grow, shrink or release the storage's device memory.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), newsize);
  }
};

struct Registrar {
  Registrar() { at::RegisterPrivateUse1HooksInterface(new NeuronHooks()); }
};
Registrar g_registrar;

}  // namespace
}  // namespace at::neuron
