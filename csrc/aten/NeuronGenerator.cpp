#include "NeuronGenerator.h"

#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/TensorImpl.h>
#include <ATen/Utils.h>
#include <ATen/Functions.h>

#include <deque>
#include <mutex>

#include "NeuronFunctions.h"
#include "csrc/runtime/Philox.h"

namespace at::neuron {

constexpr size_t kStateSize = 2 * sizeof(uint64_t);

NeuronGeneratorImpl::NeuronGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(device_of_index(device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void NeuronGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

uint64_t NeuronGeneratorImpl::seed() {
  uint64_t s = c10::detail::getNonDeterministicRandom(true);
  set_current_seed(s);
  return s;
}

void NeuronGeneratorImpl::set_offset(uint64_t offset) {
  TORCH_CHECK(offset % 4 == 0, "neuron Philox offset must be a multiple of 4, got ", offset);
  offset_ = offset;
}

std::pair<uint64_t, uint64_t> NeuronGeneratorImpl::reserve(uint64_t n) {
  uint64_t start = offset_;
  offset_ += std::max<uint64_t>(4, neuronrt::philox_offset_increment(n));
  return {seed_, start};
}

void NeuronGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.dtype() == at::kByte && new_state.numel() == static_cast<int64_t>(kStateSize),
              "neuron RNG state must be a ByteTensor of ", kStateSize, " bytes (seed, offset), got ",
              new_state.numel(), " elements of ", new_state.dtype());
  TORCH_CHECK(new_state.device().is_cpu(), "RNG state must be a CPU tensor");
  uint64_t buf[2];
  std::memcpy(buf, new_state.data(), kStateSize);
  seed_ = buf[0];
  set_offset(buf[1]);
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGeneratorImpl::get_state() const {
  auto state = at::empty({static_cast<int64_t>(kStateSize)}, at::TensorOptions().dtype(at::kByte));
  uint64_t buf[2] = {seed_, offset_};
  std::memcpy(state.data_ptr(), buf, kStateSize);
  return state.getIntrusivePtr();
}

NeuronGeneratorImpl* NeuronGeneratorImpl::clone_impl() const {
  auto* g = new NeuronGeneratorImpl(device().index(), seed_);
  g->offset_ = offset_;
  return g;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::once_flag once;
  static std::deque<at::Generator> generators;
  std::call_once(once, [] {
    for (int i = 0; i < neuronrt::device_count(); ++i) {
      generators.emplace_back(at::make_generator<NeuronGeneratorImpl>(static_cast<c10::DeviceIndex>(i)));
    }
  });
  device = resolve_device(device);
  return generators[device];
}

at::Generator new_generator(c10::DeviceIndex device) {
  return at::make_generator<NeuronGeneratorImpl>(resolve_device(device));
}

}  // namespace at::neuron
