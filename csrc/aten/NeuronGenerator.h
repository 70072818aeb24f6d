// Random-number generators of neuron devices (docs/api.md, "Random numbers").
//
// A generator draws from one of two sources:
// - its engine (rng mode "cpu", the default): a CPU generator (mt19937) that
//   the random op's CPU kernel consumes, so a seeded neuron run gives the
//   CPU's numbers. A device's default generator uses the CPU default
//   generator itself as its engine: a script that mixes CPU and neuron random
//   ops consumes one stream in program order, as its CPU run does. An
//   explicit torch.Generator(device="neuron") owns an engine seeded with its
//   seed.
// - the counter-based Philox stream (seed, offset) (rng mode "philox", or a
//   generator whose state was set to an offset it has no snapshot for, as
//   DTensor's OffsetBasedRNGTracker does), the scheme of device-side RNG.
//
// The state is 16 bytes, seed (u64) then offset (u64) in both modes: the
// product documents that layout, and DTensor's _PhiloxState reads and writes
// it in place. The offset advances by the values each op draws. In cpu mode
// get_state() also keeps a snapshot of the engine under the (seed, offset) it
// returns, in a registry of the process (a pair names one engine state, for
// every generator), and set_state() of such a pair restores the engine
// exactly: round trips, clones, deep copies. A pair it does not know is taken
// as an offset into the counter stream when the caller moves away from a state
// it got (DTensor) or calls set_offset, and otherwise as naming the engine's
// current state (a state saved by another process, restored after the CPU
// state that carries the engine).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/util/ArrayRef.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "csrc/runtime/Runtime.h"

namespace at::neuron {

using neuronrt::RngMode;

// The process-wide mode: TORCH_NEURONX_RNG at start, then set_rng_mode().
RngMode rng_mode();
void set_rng_mode(RngMode mode);

class NeuronGeneratorImpl final : public c10::GeneratorImpl {
 public:
  // `engine` is the CPU generator the engine source draws from; `shared` says
  // it is the CPU default generator (not owned: seeding it in philox mode
  // would disturb the CPU stream).
  NeuronGeneratorImpl(c10::DeviceIndex device, uint64_t seed, at::Generator engine, bool shared);

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override { return offset_; }
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  // Whether the next op draws from the engine (else from Philox).
  bool draws_from_engine() const { return rng_mode() == RngMode::Cpu && !addressed_; }
  const at::Generator& engine() const { return engine_; }
  bool shares_cpu_default() const { return shared_; }

  // Advances the offset past a draw of `n` values (a multiple of 4) and
  // returns the (seed, offset) the draw started at.
  std::pair<uint64_t, uint64_t> reserve(uint64_t n);

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

 private:
  NeuronGeneratorImpl* clone_impl() const override;
  // Moves to (seed, offset): in cpu mode the engine state the pair names if
  // there is one, else see the definition; in philox mode the counter stream.
  void move_to(uint64_t seed, uint64_t offset, bool by_offset);
  uint64_t seed_;
  mutable uint64_t offset_ = 0;  // get_state() may step past a stale snapshot
  bool addressed_ = false;       // on Philox because the state named an offset without a snapshot
  mutable at::Tensor named_;     // the engine state this generator last handed out or restored
  mutable at::Generator engine_;  // locked through its mutex, also by const readers
  bool shared_;
};

const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);

// How one call of a random op's CPU kernel draws from neuron generator `gen`
// (the RNG bridge). In cpu mode the kernel gets the generator's engine; in
// philox mode a CPU generator seeded from philox(seed, offset), so a given
// (seed, offset) always yields the same values. `generator_args` are the
// kernel's Generator arguments; an op without one (`implicit`, e.g.
// native_dropout) draws from the CPU default generator, which in philox mode
// is reseeded for the call and restored by finish(). The generator stays
// locked from construction to finish(), so that draws and offsets keep
// program order.
class GeneratorBridge {
 public:
  GeneratorBridge(NeuronGeneratorImpl* gen, bool implicit, c10::ArrayRef<c10::IValue*> generator_args);
  ~GeneratorBridge() { finish(0); }
  GeneratorBridge(const GeneratorBridge&) = delete;
  GeneratorBridge& operator=(const GeneratorBridge&) = delete;

  // After the kernel: advances the offset past the `drawn` values, restores
  // the CPU default generator, unlocks.
  void finish(uint64_t drawn);

 private:
  NeuronGeneratorImpl* gen_;
  std::unique_lock<std::mutex> lock_;
  std::optional<at::Generator> cpu_default_;
  at::Tensor cpu_state_;
};

// ---- random ops in graphs (docs/graphs.md, "Random ops") -------------------
//
// As CUDA graphs with Philox: a capture registers each generator its random
// ops draw from, and every recorded draw keeps its offset relative to the
// generator's offset at replay. Each replay reads the generator's (seed,
// offset), advances its offset by the capture's total, and hands the pair to
// its kernels through a kernel queued before the replay (stream order), so
// replays draw fresh numbers and equal eager runs from the same state. Only
// in philox mode: the cpu engine (mt19937) cannot be restarted at an offset.

// What the recorded draws of one generator read at replay.
struct GraphRng {
  at::Generator gen;
  uint64_t total = 0;  // offset units the capture's draws consume
  // The replay's start, set by the kernel queued before it.
  std::atomic<uint64_t> seed{0}, base{0};
};

// A capture of `stream` begins / ends: the generators registered meanwhile.
void begin_graph_rng(const void* stream);
std::vector<std::shared_ptr<GraphRng>> end_graph_rng(const void* stream);
// The registration of `gen` with the capture of `stream` (made at its first draw).
std::shared_ptr<GraphRng> graph_rng(const void* stream, const at::Generator& gen);

// The offset units a draw of `n` values consumes (what an eager call adds).
uint64_t draw_increment(uint64_t n);

// A random kernel's draw from Philox (seed, offset), as GeneratorBridge does
// in philox mode: its Generator arguments become a CPU generator seeded from
// the pair, or, without one (`implicit`), the CPU default generator is for
// the call (restored by the destructor).
class PhiloxDraw {
 public:
  PhiloxDraw(uint64_t seed, uint64_t offset, bool implicit, c10::ArrayRef<c10::IValue*> generator_args);
  ~PhiloxDraw();
  PhiloxDraw(const PhiloxDraw&) = delete;
  PhiloxDraw& operator=(const PhiloxDraw&) = delete;

 private:
  std::optional<at::Generator> cpu_default_;
  at::Tensor cpu_state_;
};

}  // namespace at::neuron
