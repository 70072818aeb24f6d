// DeviceGuardImplInterface for PrivateUse1: what torch.accelerator,
// torch.Stream/torch.Event, DeviceGuard and autograd's stream handling call.
#include <c10/core/DeviceCapability.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "NeuronFunctions.h"
#include "csrc/runtime/Runtime.h"

namespace at::neuron {
namespace {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

c10::Stream to_c10(const neuronrt::Stream& s) {
  return c10::Stream(c10::Stream::UNSAFE, device_of_index(s.device()), s.id());
}

neuronrt::Stream& to_rt(const c10::Stream& s) {
  return rt_call([&]() -> neuronrt::Stream& { return neuronrt::get_stream(s.device_index(), s.id()); });
}

int index_of(c10::Device d) { return d.has_index() ? d.index() : neuronrt::current_device(); }

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kNeuron, "expected a neuron device, got ", d);
    return device_of_index(rt_call([&] { return neuronrt::exchange_device(d.index()); }));
  }
  c10::Device getDevice() const override { return device_of_index(current_device()); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kNeuron, "expected a neuron device, got ", d);
    rt_call([&] { neuronrt::set_device(d.index()); });
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    // Every DeviceGuard restores the device on exit: mostly the current one.
    if (d.index() == current_device()) return;
    try {
      neuronrt::set_device(d.index());
    } catch (...) {
    }
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(neuronrt::device_count());
  }

  // torch.accelerator.get_device_capability: the dtypes a neuron tensor can
  // be allocated in and converted between. Device memory is plain bytes
  // served to ATen's kernels, so that is every dense dtype with copy/convert
  // kernels; quantized, bits, sub-byte and fp4 dtypes have none.
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    at::neuron::check_device(static_cast<c10::DeviceIndex>(index_of(d)));
    c10::DeviceCapability cap;
    cap.capability_data.capability_bits = 0;
    for (auto index : {c10::kIndex_Bool, c10::kIndex_Byte, c10::kIndex_Char, c10::kIndex_Short, c10::kIndex_Int,
                       c10::kIndex_Long, c10::kIndex_UInt16, c10::kIndex_UInt32, c10::kIndex_UInt64,
                       c10::kIndex_Half, c10::kIndex_BFloat16, c10::kIndex_Float, c10::kIndex_Double,
                       c10::kIndex_ComplexHalf, c10::kIndex_ComplexFloat, c10::kIndex_ComplexDouble,
                       c10::kIndex_Float8_e5m2, c10::kIndex_Float8_e4m3fn, c10::kIndex_Float8_e5m2fnuz,
                       c10::kIndex_Float8_e4m3fnuz, c10::kIndex_Float8_e8m0fnu}) {
      cap.capability_data.capability_bits |= uint64_t{1} << index;
    }
    if (neuronrt::strict()) {  // what the target Trainium has (docs/fidelity.md)
      for (auto index : {c10::kIndex_Double, c10::kIndex_ComplexHalf, c10::kIndex_ComplexFloat,
                         c10::kIndex_ComplexDouble, c10::kIndex_UInt64}) {
        cap.capability_data.capability_bits &= ~(uint64_t{1} << index);
      }
    }
    return cap;
  }

  // An unindexed device ("neuron") means the current device, as on CUDA.
  c10::Stream getStream(c10::Device d) const override {
    return to_c10(rt_call([&]() -> neuronrt::Stream& { return neuronrt::current_stream(index_of(d)); }));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return to_c10(rt_call([&]() -> neuronrt::Stream& { return neuronrt::default_stream(index_of(d)); }));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return to_c10(rt_call([&]() -> neuronrt::Stream& { return neuronrt::pool_stream(index_of(d), priority); }));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool isHighPriority) const override {
    return getNewStream(d, isHighPriority ? -1 : 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    neuronrt::Stream& next = to_rt(s);
    c10::Stream prev = to_c10(neuronrt::current_stream(s.device_index()));
    neuronrt::set_current_stream(next);
    return prev;
  }
  bool queryStream(const c10::Stream& s) const override { return to_rt(s).query(); }
  void synchronizeStream(const c10::Stream& s) const override {
    rt_call([&] { to_rt(s).synchronize(); });
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    rt_call([&] { neuronrt::synchronize_device(index); });
  }
  // A queued kernel owns references to the tensors it uses, so a block is
  // freed only after every kernel using it has run: reuse by any stream is
  // safe without recording streams (docs/runtime.md).
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}

  void record(void** event, const c10::Stream& s, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == s.device_index(),
                "Event device index ", device_index, " does not match recording stream's device index ",
                s.device_index(), ".");
    auto* ev = static_cast<neuronrt::Event*>(*event);
    if (!ev) {
      ev = new neuronrt::Event(flag == c10::EventFlag::BACKEND_DEFAULT);
      *event = ev;
    }
    rt_call([&] { ev->record(to_rt(s)); });
  }
  void block(void* event, const c10::Stream& s) const override {
    if (event) rt_call([&] { static_cast<neuronrt::Event*>(event)->block(to_rt(s)); });
  }
  bool queryEvent(void* event) const override {
    return !event || static_cast<neuronrt::Event*>(event)->query();
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<neuronrt::Event*>(event);
  }
  void synchronizeEvent(void* event) const override {
    if (event) rt_call([&] { static_cast<neuronrt::Event*>(event)->synchronize(); });
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "Both events must be recorded before calculating elapsed time.");
    return rt_call([&] {
      return static_cast<neuronrt::Event*>(start)->elapsed_ms(*static_cast<neuronrt::Event*>(end));
    });
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace
}  // namespace at::neuron
