#include "NeuronGenerator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/TensorImpl.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "NeuronFunctions.h"

namespace at::neuron {
namespace {

constexpr size_t kStateSize = 2 * sizeof(uint64_t);
// Engine snapshots kept (about 5 KB each): enough for activation
// checkpointing of every layer of deep models between forward and recomputation.
constexpr size_t kMaxSnapshots = 2048;

std::atomic<RngMode>& mode_flag() {
  static std::atomic<RngMode> mode{neuronrt::rng_mode_setting()};
  return mode;
}

at::Tensor engine_state(at::Generator engine) {
  std::lock_guard<std::mutex> lock(engine.mutex());
  return engine.get_state();
}

at::Tensor fresh_engine_state(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed).get_state();
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.const_data_ptr(), b.const_data_ptr(), a.nbytes()) == 0;
}

// The engine states that states handed out in cpu mode name, by (seed, offset).
class SnapshotRegistry {
 public:
  static SnapshotRegistry& instance() {
    static SnapshotRegistry registry;
    return registry;
  }

  // The engine state the pair names: a snapshot, or for offset 0 the freshly
  // seeded engine. Undefined if none.
  at::Tensor find(uint64_t seed, uint64_t offset) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->seed == seed && it->offset == offset) {
          // Most recently used last. Erase before push_back: a deque's
          // push_back invalidates its iterators.
          Entry hit = std::move(*it);
          entries_.erase(it);
          at::Tensor state = hit.engine_state;
          entries_.push_back(std::move(hit));
          return state;
        }
      }
    }
    return offset == 0 ? fresh_engine_state(seed) : at::Tensor();
  }

  // Names `state` by (seed, offset), or by the first pair after it (steps of
  // 4) that is free or already names it; returns that offset.
  uint64_t name(uint64_t seed, uint64_t offset, const at::Tensor& state) {
    for (;; offset += 4) {
      at::Tensor known = find(seed, offset);
      if (known.defined() && same_bytes(known, state)) return offset;
      if (known.defined()) continue;
      std::lock_guard<std::mutex> lock(mutex_);
      entries_.push_back({seed, offset, state});
      if (entries_.size() > kMaxSnapshots) entries_.pop_front();
      return offset;
    }
  }

 private:
  struct Entry {
    uint64_t seed;
    uint64_t offset;
    at::Tensor engine_state;
  };
  std::mutex mutex_;
  std::deque<Entry> entries_;  // least recently used first
};

}  // namespace

RngMode rng_mode() { return mode_flag().load(std::memory_order_relaxed); }
void set_rng_mode(RngMode mode) { mode_flag().store(mode, std::memory_order_relaxed); }

NeuronGeneratorImpl::NeuronGeneratorImpl(c10::DeviceIndex device, uint64_t seed, at::Generator engine, bool shared)
    : c10::GeneratorImpl(device_of_index(device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed),
      engine_(std::move(engine)),
      shared_(shared) {}

void NeuronGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
  addressed_ = false;
  named_ = at::Tensor();
  // A shared engine is the CPU default generator: seeding it in philox mode
  // would move the CPU stream for nothing.
  if (!shared_ || rng_mode() == RngMode::Cpu) {
    std::lock_guard<std::mutex> lock(engine_.mutex());
    engine_.set_current_seed(seed);
  }
}

uint64_t NeuronGeneratorImpl::seed() {
  uint64_t s = c10::detail::getNonDeterministicRandom(true);
  set_current_seed(s);
  return s;
}

void NeuronGeneratorImpl::set_offset(uint64_t offset) {
  TORCH_CHECK(offset % 4 == 0, "neuron RNG offset must be a multiple of 4, got ", offset);
  move_to(seed_, offset, /*by_offset=*/true);
}

uint64_t draw_increment(uint64_t n) { return std::max<uint64_t>(4, neuronrt::philox_offset_increment(n)); }

std::pair<uint64_t, uint64_t> NeuronGeneratorImpl::reserve(uint64_t n) {
  uint64_t start = offset_;
  offset_ += draw_increment(n);
  return {seed_, start};
}

void NeuronGeneratorImpl::move_to(uint64_t seed, uint64_t offset, bool by_offset) {
  if (rng_mode() == RngMode::Cpu) {
    at::Tensor snapshot = SnapshotRegistry::instance().find(seed, offset);
    if (snapshot.defined()) {
      std::lock_guard<std::mutex> lock(engine_.mutex());
      engine_.set_state(snapshot);
      seed_ = seed;
      offset_ = offset;
      addressed_ = false;
      named_ = snapshot;
      return;
    }
    // A pair nobody here handed out. Moving away from a state this generator
    // handed out (DTensor's per-shard offsets), set_offset, or moving on in
    // the counter stream: the caller addresses the counter stream, which the
    // engine cannot seek. Otherwise it is a state saved elsewhere (another
    // process) whose engine state the caller restored with the CPU state
    // (torch.set_rng_state, as Accelerate and Trainer do first): name it.
    at::Tensor now = engine_state(engine_);
    if (!by_offset && !addressed_ && !(named_.defined() && same_bytes(named_, now))) {
      seed_ = seed;
      offset_ = SnapshotRegistry::instance().name(seed, offset, now);
      named_ = now;
      return;
    }
    addressed_ = true;
  }
  seed_ = seed;
  offset_ = offset;
}

void NeuronGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  const int64_t n = new_state.numel();
  TORCH_CHECK(new_state.dtype() == at::kByte && (n == kStateSize || n == sizeof(uint64_t)),
              "neuron RNG state must be a ByteTensor of ", kStateSize, " bytes (seed, offset) or ",
              sizeof(uint64_t), " bytes (seed), got ", n, " elements of ", new_state.dtype());
  TORCH_CHECK(new_state.device().is_cpu(), "RNG state must be a CPU tensor");
  TORCH_CHECK(new_state.is_contiguous(), "RNG state must be contiguous");
  uint64_t buf[2] = {0, 0};
  std::memcpy(buf, new_state.data(), n);  // 8 bytes: the seed, at offset 0 (as the product reads it)
  TORCH_CHECK(buf[1] % 4 == 0, "neuron RNG offset must be a multiple of 4, got ", buf[1]);
  move_to(buf[0], buf[1], /*by_offset=*/false);
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGeneratorImpl::get_state() const {
  if (draws_from_engine()) {
    // Name the engine's current state by (seed, offset). A pair already
    // naming another state (after engine draws the offset does not count,
    // such as CPU ops drawing from the shared engine, or another generator's)
    // is not reused: the offset steps past it.
    named_ = engine_state(engine_);
    offset_ = SnapshotRegistry::instance().name(seed_, offset_, named_);
  }
  auto state = at::empty({static_cast<int64_t>(kStateSize)}, at::TensorOptions().dtype(at::kByte));
  uint64_t buf[2] = {seed_, offset_};
  std::memcpy(state.data_ptr(), buf, kStateSize);
  return state.getIntrusivePtr();
}

NeuronGeneratorImpl* NeuronGeneratorImpl::clone_impl() const {
  // The clone owns a copy of the engine: drawing from it must not move the
  // CPU stream or this generator.
  at::Generator engine;
  {
    std::lock_guard<std::mutex> lock(engine_.mutex());
    engine = engine_.clone();
  }
  auto* g = new NeuronGeneratorImpl(device().index(), seed_, std::move(engine), /*shared=*/false);
  g->offset_ = offset_;
  g->addressed_ = addressed_;
  return g;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::once_flag once;
  static std::deque<at::Generator> generators;
  std::call_once(once, [] {
    // The CPU default generator's seed is c10::default_rng_seed_val too.
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    for (int i = 0; i < neuronrt::device_count(); ++i) {
      generators.emplace_back(at::make_generator<NeuronGeneratorImpl>(static_cast<c10::DeviceIndex>(i),
                                                                      cpu.current_seed(), cpu, /*shared=*/true));
    }
  });
  device = resolve_device(device);
  return generators[device];
}

at::Generator new_generator(c10::DeviceIndex device) {
  return at::make_generator<NeuronGeneratorImpl>(resolve_device(device), c10::default_rng_seed_val,
                                                 at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val),
                                                 /*shared=*/false);
}

namespace {

at::Generator philox_bridge(uint64_t seed, uint64_t offset) {
  auto r = neuronrt::philox4x32(seed, offset >> 2, /*subsequence=*/0x6e6575726f6eULL);
  uint64_t mixed = (static_cast<uint64_t>(r[1]) << 32) | r[0];
  return at::make_generator<at::CPUGeneratorImpl>(mixed);
}

}  // namespace

GeneratorBridge::GeneratorBridge(NeuronGeneratorImpl* gen, bool implicit, c10::ArrayRef<c10::IValue*> generator_args)
    : gen_(gen), lock_(gen->mutex_) {
  if (gen->draws_from_engine()) {
    // An implicit draw takes the CPU default generator, which is the default
    // neuron generator's engine in cpu mode.
    TORCH_INTERNAL_ASSERT(!implicit || gen->shares_cpu_default());
    for (c10::IValue* arg : generator_args) *arg = gen->engine();
  } else if (implicit) {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    at::Generator seeded = philox_bridge(gen->current_seed(), gen->get_offset());
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu_state_ = cpu.get_state();
    cpu.set_state(seeded.get_state());
    cpu_default_ = cpu;
  } else {
    for (c10::IValue* arg : generator_args) *arg = philox_bridge(gen->current_seed(), gen->get_offset());
  }
}

void GeneratorBridge::finish(uint64_t drawn) {
  if (!lock_.owns_lock()) return;
  if (drawn > 0) gen_->reserve(drawn);
  if (cpu_default_) {
    std::lock_guard<std::mutex> lock(cpu_default_->mutex());
    cpu_default_->set_state(cpu_state_);
    cpu_default_.reset();
  }
  lock_.unlock();
}

PhiloxDraw::PhiloxDraw(uint64_t seed, uint64_t offset, bool implicit, c10::ArrayRef<c10::IValue*> generator_args) {
  if (implicit) {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    at::Generator seeded = philox_bridge(seed, offset);
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu_state_ = cpu.get_state();
    cpu.set_state(seeded.get_state());
    cpu_default_ = cpu;
  } else {
    for (c10::IValue* arg : generator_args) *arg = philox_bridge(seed, offset);
  }
}

PhiloxDraw::~PhiloxDraw() {
  if (!cpu_default_) return;
  std::lock_guard<std::mutex> lock(cpu_default_->mutex());
  cpu_default_->set_state(cpu_state_);
}

namespace {
std::mutex graph_rng_mutex;
// Capturing stream -> the generators its capture registered.
std::map<const void*, std::vector<std::shared_ptr<GraphRng>>>& graph_rngs() {
  static std::map<const void*, std::vector<std::shared_ptr<GraphRng>>> m;
  return m;
}
}  // namespace

void begin_graph_rng(const void* stream) {
  std::lock_guard<std::mutex> lock(graph_rng_mutex);
  graph_rngs()[stream].clear();
}

std::vector<std::shared_ptr<GraphRng>> end_graph_rng(const void* stream) {
  std::lock_guard<std::mutex> lock(graph_rng_mutex);
  auto node = graph_rngs().extract(stream);
  return node.empty() ? std::vector<std::shared_ptr<GraphRng>>{} : std::move(node.mapped());
}

std::shared_ptr<GraphRng> graph_rng(const void* stream, const at::Generator& gen) {
  std::lock_guard<std::mutex> lock(graph_rng_mutex);
  auto& list = graph_rngs()[stream];
  for (const auto& r : list) {
    if (r->gen == gen) return r;
  }
  auto r = std::make_shared<GraphRng>();
  r->gen = gen;
  list.push_back(r);
  return r;
}

}  // namespace at::neuron
