#include "csrc/distributed/ProcessGroupNeuron.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/thread_name.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "csrc/aten/HostExecution.h"
#include "csrc/aten/NeuronFunctions.h"
#include "csrc/runtime/CachingAllocator.h"
#include "csrc/runtime/ShmCollectives.h"
#include "csrc/runtime/Runtime.h"
#include "csrc/runtime/Stream.h"

namespace c10d {

namespace {

// Longest timeout honoured as a deadline (larger ones would overflow the
// clock arithmetic; a year is "forever" for a collective).
constexpr std::chrono::milliseconds kMaxTimeout{std::chrono::hours(24 * 365)};

bool is_fp8(at::ScalarType t) {
  return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2 || t == at::kFloat8_e4m3fnuz ||
         t == at::kFloat8_e5m2fnuz || t == at::ScalarType::Float8_e8m0fnu;
}

// Element types Gloo's kernels are instantiated for.
bool gloo_has_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16: case at::kChar: case at::kByte:
    case at::kInt: case at::kLong: case at::kBool:
      return true;
    default:
      return false;
  }
}

// A zero-copy CPU alias of `t` (neuron memory; CPU tensors unchanged).
at::Tensor host_view(const at::Tensor& t) {
  return at::neuron::host_alias(t);
}

std::vector<at::Tensor> host_view(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(host_view(t));
  return out;
}

// The CPU view of `t` a data-movement collective hands the transport: the
// alias, reinterpreted as bytes when Gloo has no kernels for its dtype (fp8,
// int16, uint16-64, complex). Dimension 0 is kept, so all_to_all splits hold.
at::Tensor to_host(const at::Tensor& t) {
  at::Tensor h = host_view(t);
  if (gloo_has_dtype(h.scalar_type()) || !h.defined()) return h;
  if (h.dim() == 0) h = h.view({1});
  TORCH_CHECK_VALUE(h.stride(-1) == 1 || h.numel() <= 1, "neuron backend: ", h.scalar_type(),
                    " tensors are moved as bytes and must be contiguous in their last dimension");
  return h.view(at::kByte);
}

std::vector<at::Tensor> to_host(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(to_host(t));
  return out;
}

std::vector<std::vector<at::Tensor>> to_host(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(lists.size());
  for (const auto& l : lists) out.push_back(to_host(l));
  return out;
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

const char* reduce_op_name(ReduceOp::RedOpType op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::BAND: return "BAND";
    case ReduceOp::BOR: return "BOR";
    case ReduceOp::BXOR: return "BXOR";
    case ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

// What Gloo would reject with an obscure message (or not at all), rejected
// up front with a TypeError naming the op, the dtype and the way out.
void check_reduction(const std::vector<at::Tensor>& tensors, const ReduceOp& op, const char* collective) {
  const auto kind = op.op_;
  for (const auto& t : tensors) {
    const auto dtype = t.scalar_type();
    TORCH_CHECK_TYPE(!is_fp8(dtype), "neuron backend: ", collective, " cannot reduce ", dtype,
                     " tensors: fp8 is supported for data movement only (broadcast, all_gather, gather, scatter, "
                     "all_to_all, send/recv). Upcast to bfloat16 or float32 to reduce.");
    const bool floating = at::isFloatingType(dtype) || at::isComplexType(dtype);
    TORCH_CHECK_TYPE(!(kind == ReduceOp::AVG && !floating), "neuron backend: ", collective,
                     " with ReduceOp.AVG needs floating-point or complex tensors, got ", dtype,
                     ": an integer average is not representable. Reduce with ReduceOp.SUM and divide.");
    TORCH_CHECK_TYPE(!(kind == ReduceOp::PREMUL_SUM && !floating), "neuron backend: ", collective,
                     " with ReduceOp.PREMUL_SUM needs floating-point or complex tensors, got ", dtype, ".");
    const bool bitwise = kind == ReduceOp::BAND || kind == ReduceOp::BOR || kind == ReduceOp::BXOR;
    TORCH_CHECK_TYPE(!(bitwise && !at::isIntegralType(dtype, /*includeBool=*/true)), "neuron backend: ", collective,
                     " with ReduceOp.", reduce_op_name(kind), " needs integer or bool tensors, got ", dtype, ".");
    TORCH_CHECK_TYPE(!(at::isComplexType(dtype) && kind != ReduceOp::SUM && kind != ReduceOp::AVG &&
                       kind != ReduceOp::PREMUL_SUM),
                     "neuron backend: ", collective, " with ReduceOp.", reduce_op_name(kind),
                     " is not defined for complex tensors (", dtype, ").");
  }
}

// PREMUL_SUM's factor as a scalar (the supplement holds a double or a
// one-element tensor, possibly on neuron).
at::Scalar premul_factor(const ReduceOp& op) {
  auto sup = c10::dynamic_intrusive_pointer_cast<PreMulSumSupplement>(op.supplement_);
  TORCH_CHECK(sup, "ReduceOp.PREMUL_SUM has no factor: create it with torch.distributed._make_nccl_premul_sum");
  if (sup->tensor_factor.defined()) return host_view(sup->tensor_factor).reshape({}).item();
  return sup->double_factor;
}

// Gloo reduces int16/uint16/uint32 nowhere; a wider integer gives the same
// bits (sum, product, min, max and bitwise ops all commute with truncation
// modulo 2^16 / 2^32 in two's complement).
std::optional<at::ScalarType> widened(at::ScalarType t) {
  switch (t) {
    case at::kShort: case at::kUInt16: return at::kInt;
    case at::kUInt32: return at::kLong;
    default: return std::nullopt;
  }
}

// What Gloo reduces for host alias `h`: `h` itself, or a scratch copy when
// PREMUL_SUM scales it (the caller's input is never scaled) or its dtype is
// widened. Results land in the scratch and are copied back.
at::Tensor reduction_input(const at::Tensor& h, const ReduceOp& op) {
  at::Tensor s = h;
  if (op.op_ == ReduceOp::PREMUL_SUM) s = s.mul(premul_factor(op));
  if (auto w = widened(s.scalar_type())) s = s.to(*w);
  return s.is_same(h) ? h : s.contiguous();
}

std::vector<at::Tensor> reduction_input(const std::vector<at::Tensor>& hs, const ReduceOp& op) {
  std::vector<at::Tensor> out;
  out.reserve(hs.size());
  for (const auto& h : hs) out.push_back(reduction_input(h, op));
  return out;
}

// Copies scratch results back into the caller's tensors (no-op when Gloo
// reduced in place).
std::function<void()> copy_back(std::vector<at::Tensor> dst, std::vector<at::Tensor> src) {
  return [dst = std::move(dst), src = std::move(src)]() mutable {
    for (size_t i = 0; i < dst.size(); ++i) {
      if (!dst[i].is_same(src[i])) dst[i].copy_(src[i].view(dst[i].sizes()));
    }
  };
}

ReduceOp gloo_op(const ReduceOp& op) {
  return op.op_ == ReduceOp::PREMUL_SUM ? ReduceOp(ReduceOp::SUM) : op;
}

// The device the work's future reports: the neuron device of the outputs
// (or inputs), none for CPU-only collectives.
std::vector<c10::Device> devices_of(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b = {}) {
  std::optional<c10::Device> dev;
  for (const auto* list : {&a, &b}) {
    for (const auto& t : *list) {
      if (!t.defined() || t.device().is_cpu()) continue;
      TORCH_CHECK_VALUE(!dev || *dev == t.device(), "neuron backend: all tensors of one collective must be on the ",
                        "same device (or on cpu), got ", *dev, " and ", t.device());
      dev = t.device();
    }
  }
  if (!dev) return {};
  return {*dev};
}

class SilentWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

template <typename T>
std::string join(const std::vector<T>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += std::to_string(items[i]);
  }
  return out;
}

std::string error_message(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

ErrorType classify(const std::string& msg) {
  std::string lower(msg);
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos) {
    return ErrorType::TIMEOUT;
  }
  if (lower.find("closed") != std::string::npos || lower.find("reset") != std::string::npos ||
      lower.find("peer") != std::string::npos) {
    return ErrorType::REMOTE_ERROR;
  }
  return ErrorType::COMM_ERROR;
}

void note_error(std::atomic<ErrorType>& sink, ErrorType type) {
  auto expected = ErrorType::SUCCESS;
  sink.compare_exchange_strong(expected, type);
}

// The shared-memory engine's element type for `t`, if it reduces it.
std::optional<neuronrt::ShmDtype> shm_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return neuronrt::ShmDtype::Float32;
    case at::kDouble: return neuronrt::ShmDtype::Float64;
    case at::kHalf: return neuronrt::ShmDtype::Float16;
    case at::kBFloat16: return neuronrt::ShmDtype::BFloat16;
    case at::kChar: return neuronrt::ShmDtype::Int8;
    case at::kByte: return neuronrt::ShmDtype::UInt8;
    case at::kShort: return neuronrt::ShmDtype::Int16;
    case at::kInt: return neuronrt::ShmDtype::Int32;
    case at::kLong: return neuronrt::ShmDtype::Int64;
    default: return std::nullopt;
  }
}

// PREMUL_SUM reaches the engine as SUM over the scaled scratch (gloo_op).
std::optional<neuronrt::ShmReduceOp> shm_op(ReduceOp::RedOpType op) {
  switch (op) {
    case ReduceOp::SUM: case ReduceOp::PREMUL_SUM: return neuronrt::ShmReduceOp::Sum;
    case ReduceOp::AVG: return neuronrt::ShmReduceOp::Avg;
    case ReduceOp::MIN: return neuronrt::ShmReduceOp::Min;
    case ReduceOp::MAX: return neuronrt::ShmReduceOp::Max;
    case ReduceOp::PRODUCT: return neuronrt::ShmReduceOp::Product;
    default: return std::nullopt;
  }
}

// Whether the engine reduces `t` with `op` (dtype after widening; AVG only
// for floating types, which check_reduction already enforced).
bool shm_reduces(const at::Tensor& t, const ReduceOp& op) {
  const auto dtype = widened(t.scalar_type()).value_or(t.scalar_type());
  const auto d = shm_dtype(dtype);
  const auto o = shm_op(op.op_);
  return d && o && neuronrt::shm_supports(*d, *o);
}

// The engine moves bytes for all_gather: any dtype whose elements have a size.
bool shm_moves(const at::Tensor& t) {
  return t.defined() && !t.is_sparse() && t.element_size() > 0;
}

std::string store_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> store_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// A 0/1 switch from the environment; anything else is a clear error.
bool env_switch(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  const std::string s(v);
  TORCH_CHECK_VALUE(s == "0" || s == "1", name, " must be 0 or 1, got '", s, "'");
  return s == "1";
}

// ---- local argument checks ----------------------------------------------------
// A rank that rejects its own arguments raises ValueError / TypeError with the
// details, and announces the kind of problem to its peers through the
// argument check (validate()), whose error then names it.
enum class ArgProblem : int64_t { Other = 1, Device, EmptyList, ListLength, Dtype, Size, Splits, Reduction };

// Marks a rank's check words as "rejected its arguments" (word 1, where the
// dtype goes otherwise; word 2 holds the ArgProblem).
constexpr int64_t kRejected = -2;

const char* arg_problem_text(int64_t p) {
  switch (static_cast<ArgProblem>(p)) {
    case ArgProblem::Device: return "tensors on different devices";
    case ArgProblem::EmptyList: return "an empty tensor list";
    case ArgProblem::ListLength: return "a tensor list of the wrong length";
    case ArgProblem::Dtype: return "mismatched dtypes";
    case ArgProblem::Size: return "mismatched tensor sizes";
    case ArgProblem::Splits: return "invalid split sizes";
    case ArgProblem::Reduction: return "a reduction its dtype does not support";
    default: return "invalid arguments";
  }
}

struct ArgumentRejected {
  ArgProblem problem;
  std::exception_ptr error;
};

template <typename... Args>
[[noreturn]] void reject_value(ArgProblem problem, const Args&... args) {
  try {
    C10_THROW_ERROR(ValueError, c10::str("neuron backend: ", args...));
  } catch (...) {
    throw ArgumentRejected{problem, std::current_exception()};
  }
}

template <typename... Args>
[[noreturn]] void reject_type(ArgProblem problem, const Args&... args) {
  try {
    C10_THROW_ERROR(TypeError, c10::str("neuron backend: ", args...));
  } catch (...) {
    throw ArgumentRejected{problem, std::current_exception()};
  }
}

// PyTorch's wording where ProcessGroupNCCL has a message for the condition.
void check_nonempty(const char* op, const std::vector<at::Tensor>& ts, const char* what) {
  if (ts.empty()) reject_value(ArgProblem::EmptyList, op, ": Tensor list must be nonempty (", what, ")");
}

// Every tensor of one collective on one device: all on the same neuron
// device, or all on cpu (NCCL: "Tensors must be on the same device").
struct Located {
  const std::vector<at::Tensor>* tensors;
  const char* what;
};

void check_same_device(const char* op, std::initializer_list<Located> lists) {
  const at::Tensor* first = nullptr;
  std::string firstName;
  for (const auto& l : lists) {
    for (size_t i = 0; i < l.tensors->size(); ++i) {
      const at::Tensor& t = (*l.tensors)[i];
      const std::string name = l.tensors->size() == 1 ? std::string(l.what) : c10::str(l.what, " ", i);
      if (!t.defined()) reject_value(ArgProblem::Other, op, ": ", name, " is an undefined tensor");
      if (t.is_sparse()) reject_value(ArgProblem::Other, op, ": Tensors must be dense (", name, " is sparse)");
      if (!first) {
        first = &t;
        firstName = name;
      } else if (t.device() != first->device()) {
        reject_value(ArgProblem::Device, op, ": Tensors must be on the same device, got ", firstName, " on ",
                     first->device(), " and ", name, " on ", t.device());
      }
    }
  }
}

void check_dtype(const char* op, const at::Tensor& t, const std::string& what, at::ScalarType want,
                 const char* wantWhat) {
  if (t.scalar_type() != want) {
    reject_type(ArgProblem::Dtype, op, ": ", what, " must be the same type as the ", wantWhat, ", got ",
                t.scalar_type(), " and ", want);
  }
}

void check_splits(const char* op, const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                  const char* what) {
  if (splits.empty()) {
    if (t.dim() == 0 || t.size(0) % size != 0) {
      reject_value(ArgProblem::Splits, op, ": Tensor's dim 0 does not divide equally across group size (", what,
                   " has ", t.dim() == 0 ? 0 : t.size(0), " rows, group size ", size, ")");
    }
    return;
  }
  if (static_cast<int>(splits.size()) != size) {
    reject_value(ArgProblem::Splits, op, ": Number of tensor splits not equal to group size (", what, " splits ",
                 c10::IntArrayRef(splits), ", group size ", size, ")");
  }
  int64_t sum = 0;
  for (int64_t s : splits) {
    if (s < 0) reject_value(ArgProblem::Splits, op, ": Split sizes must be non-negative, got ", what, " splits ",
                            c10::IntArrayRef(splits));
    sum += s;
  }
  if (t.dim() == 0 || sum != t.size(0)) {
    reject_value(ArgProblem::Splits, op, ": Split sizes doesn't match total dim 0 size (", what, " splits ",
                 c10::IntArrayRef(splits), " sum to ", sum, ", ", what, " has ", t.dim() == 0 ? 0 : t.size(0),
                 " rows)");
  }
}

// gather's and scatter's arguments: one tensor on every rank (`single`) and,
// on the root only, a list of group-size tensors of its dtype and size
// (`lists`: the `listWhat` tensors, named `listName`). `role` names the root
// ("destination").
void check_rooted(const char* op, int rank, int size, int root, const char* role,
                  const std::vector<at::Tensor>& single, const char* singleWhat,
                  const std::vector<std::vector<at::Tensor>>& lists, const char* listWhat, const char* listName) {
  if (root < 0 || root >= size) {
    reject_value(ArgProblem::Other, op, ": invalid ", role, " rank ", root, " for group size ", size);
  }
  if (single.size() != 1) {
    reject_value(ArgProblem::ListLength, op, ": takes one ", singleWhat, " tensor, got ", single.size());
  }
  const std::vector<at::Tensor> flat = flatten(lists);
  check_same_device(op, {{&single, singleWhat}, {&flat, listWhat}});
  if (rank != root) {
    if (!flat.empty()) reject_value(ArgProblem::ListLength, op, ": only the ", role, " rank passes a ", listName);
    return;
  }
  if (lists.size() != 1 || static_cast<int>(lists[0].size()) != size) {
    reject_value(ArgProblem::ListLength, op, ": invalid ", listName, " on the ", role, " rank (expected ", size,
                 " tensors, the group size, got ", lists.empty() ? 0 : lists[0].size(), ")");
  }
  for (int r = 0; r < size; ++r) {
    check_dtype(op, lists[0][r], c10::str(listName, "[", r, "]"), single[0].scalar_type(), singleWhat);
    if (lists[0][r].numel() != single[0].numel()) {
      reject_value(ArgProblem::Size, op, ": ", listName, "[", r, "] must have the ", singleWhat, "'s size, got ",
                   lists[0][r].sizes(), " and ", single[0].sizes());
    }
  }
}

// check_reduction's TypeErrors, announced to the peers as well.
void check_reduction_arg(const std::vector<at::Tensor>& tensors, const ReduceOp& op, const char* collective) {
  try {
    check_reduction(tensors, op, collective);
  } catch (...) {
    throw ArgumentRejected{ArgProblem::Reduction, std::current_exception()};
  }
}

// The prefix under which a group rendezvous (its transport and shared-memory
// keys): a torchrun restart reuses the agent's store, so each attempt needs
// its own keys. The root group gets the same prefix in torch_neuronx/distributed.py.
c10::intrusive_ptr<Store> attempt_store(const c10::intrusive_ptr<Store>& store) {
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return c10::make_intrusive<PrefixStore>(c10::str("neuron/", attempt ? attempt : "0", "/"), store);
}

// Works complete on transport threads (Gloo's, the completion queue's, the
// watchdog). Dropping a work's last reference there can drop a tensor's last
// C++ reference, which releases its PyObject under the GIL; a thread that
// asks for the GIL while the interpreter finalizes ends with pthread_exit
// through a noexcept frame: std::terminate. So those threads complete and
// release works inside a CompletionScope, and at exit (atexit, before
// finalization) quiesceCompletions() waits for the open scopes and makes
// later ones leak what they hold: the process is going away.
struct CompletionState {
  std::mutex mutex;
  std::condition_variable cv;
  int open = 0;
  bool exiting = false;
};

CompletionState& completion_state() {
  static auto* state = new CompletionState();  // outlives static destruction
  return *state;
}

class CompletionScope {
 public:
  CompletionScope() {
    auto& s = completion_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    active_ = !s.exiting;
    if (active_) ++s.open;
  }
  ~CompletionScope() {
    if (!active_) return;
    auto& s = completion_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (--s.open == 0) s.cv.notify_all();
  }
  CompletionScope(const CompletionScope&) = delete;
  CompletionScope& operator=(const CompletionScope&) = delete;
  // False once the process exits: the caller leaks instead of completing.
  bool active() const { return active_; }
  template <class T>
  static void leak(T&& value) {
    (void)new std::decay_t<T>(std::forward<T>(value));
  }

 private:
  bool active_ = false;
};

}  // namespace

// ---- WorkNeuron --------------------------------------------------------------

ProcessGroupNeuron::WorkNeuron::WorkNeuron(int rank, OpType opType, uint64_t seq, std::string describe,
                                           std::chrono::milliseconds timeout, std::vector<at::Tensor> outputs,
                                           std::vector<c10::Device> devices,
                                           std::shared_ptr<std::atomic<ErrorType>> errorSink)
    : Work(rank, opType),
      seq_(seq),
      describe_(std::move(describe)),
      timeout_(std::min(timeout, kMaxTimeout)),
      start_(std::chrono::steady_clock::now()),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::move(devices))),
      errorSink_(std::move(errorSink)) {}

std::exception_ptr ProcessGroupNeuron::WorkNeuron::wrap(std::exception_ptr error, const char* what) const {
  const std::string msg = error_message(error);
  return std::make_exception_ptr(
      c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, describe_ + " " + what + msg));
}

void ProcessGroupNeuron::WorkNeuron::release_resources() {
  outputs_.clear();
  future_.reset();
  transport_.reset();
}

void ProcessGroupNeuron::WorkNeuron::complete(std::exception_ptr error, const std::function<void()>& after) {
  if (claimed_.exchange(true)) return;
  if (!error && after) {
    try {
      after();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) {
    const auto kind = classify(error_message(error));
    note_error(*errorSink_, kind);
    if (kind == ErrorType::TIMEOUT && watchdog_) {
      std::lock_guard<std::mutex> lock(watchdog_->mutex);
      watchdog_->timedOut.push_back(describe_);
      watchdog_->cv.notify_all();
    }
    error = wrap(error, "failed: ");
  }
  // The future first: whoever wait() releases may read it at once.
  if (error) {
    future_->setErrorIfNeeded(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    exception_ = error;
  }
  cv_.notify_all();
}

bool ProcessGroupNeuron::WorkNeuron::wait(std::chrono::milliseconds timeout) {
  // Without an explicit timeout the group's timeout counts from the launch,
  // so a hung peer surfaces here even when the transport never returns.
  const auto deadline = timeout == kNoTimeout ? start_ + timeout_
                                              : std::chrono::steady_clock::now() + std::min(timeout, kMaxTimeout);
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_until(lock, deadline, [&] { return completed_; })) {
    lock.unlock();
    note_error(*errorSink_, ErrorType::TIMEOUT);
    const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
    C10_THROW_ERROR(DistBackendError, c10::str(describe_, " timed out: not completed after ", limit.count(),
                                               " ms (the peer may have hung or exited)"));
  }
  if (exception_) std::rethrow_exception(exception_);
  // Streams: the transport wrote the outputs on the host before completing,
  // and kernels launched after this returns are queued behind it.
  return true;
}

void ProcessGroupNeuron::WorkNeuron::abort() {
  if (transport_) {
    try {
      transport_->abort();
    } catch (...) {  // Gloo's collective works cannot be aborted; abort() fails this work anyway
    }
  }
  complete(std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                                         "the work was aborted")),
           {});
}

int ProcessGroupNeuron::WorkNeuron::sourceRank() const {
  TORCH_CHECK(transport_, "sourceRank() is only defined for recv from any source");
  return transport_->sourceRank();
}

// ---- ProcessGroupNeuron ---------------------------------------------------------

ProcessGroupNeuron::ProcessGroupNeuron(c10::intrusive_ptr<Backend> gloo, int rank, int size,
                                       c10::intrusive_ptr<Options> options, c10::intrusive_ptr<Store> store)
    : Backend(rank, size), gloo_(std::move(gloo)), options_(std::move(options)) {
  TORCH_CHECK(gloo_, "ProcessGroupNeuron needs a transport backend");
  TORCH_CHECK(gloo_->getRank() == rank && gloo_->getSize() == size, "ProcessGroupNeuron: transport is rank ",
              gloo_->getRank(), " of ", gloo_->getSize(), ", expected rank ", rank, " of ", size);
  if (!options_) options_ = Options::create();
  const char* check = std::getenv("TORCH_NEURONX_COLLECTIVE_CHECK");
  checkAgreement_ = !(check && std::string(check) == "0");
  if (const char* mode = std::getenv("TORCH_NEURONX_ASYNC_ERROR_HANDLING")) {
    const std::string m(mode);
    TORCH_CHECK_VALUE(m == "0" || m == "1" || m == "2" || m == "3",
                      "TORCH_NEURONX_ASYNC_ERROR_HANDLING must be 0, 1, 2 or 3, got '", m, "'");
    errorHandling_ = std::stoi(m);
  }
  setupShm(store);
  init();
}

void ProcessGroupNeuron::setupShm(const c10::intrusive_ptr<Store>& store) {
  const bool direct = env_switch("TORCH_NEURONX_SHM_DIRECT", true);  // read before any rendezvous
  if (!env_switch("TORCH_NEURONX_SHM", true)) return;
  if (!store || size_ < 2) return;
  // Every rank reads every rank's keys, so all reach the same decision.
  auto s = c10::make_intrusive<PrefixStore>("shm/", store);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  s->set(c10::str("host/", rank_), store_bytes(host));
  for (int r = 0; r < size_; ++r) {
    if (store_string(s->get(c10::str("host/", r))) != host) return;  // spans hosts: Gloo only
  }
  std::unique_ptr<neuronrt::ShmCollectives> shm;
  try {
    if (rank_ == 0) {
      std::string name;
      try {
        shm = neuronrt::ShmCollectives::create(0, size_);
        name = shm->name();
      } catch (const neuronrt::ShmError&) {
      }
      s->set("name", store_bytes(name));  // empty: rank 0 could not create it
    } else {
      const std::string name = store_string(s->get("name"));
      if (!name.empty()) shm = neuronrt::ShmCollectives::attach(name, rank_, size_);
    }
  } catch (const neuronrt::ShmError&) {
    shm.reset();  // e.g. same host name, other host: the segment is not there
  }
  s->set(c10::str("attached/", rank_), store_bytes(shm ? "1" : "0"));
  bool all = true;
  for (int r = 0; r < size_; ++r) all = store_string(s->get(c10::str("attached/", r))) == "1" && all;
  // Everyone has attached (or given up): the name is no longer needed, and
  // without it the segment goes away with the last process that maps it.
  if (rank_ == 0 && shm) shm->unlink();
  if (!all) return;
  // The single-copy path: peers map each other's device memory. The probe
  // is a collective: the ranks run it only if all of them want it.
  s->set(c10::str("direct/", rank_), store_bytes(direct ? "1" : "0"));
  bool wanted = true;
  for (int r = 0; r < size_; ++r) wanted = store_string(s->get(c10::str("direct/", r))) == "1" && wanted;
  if (wanted) {
    try {
      if (shm->enable_peer_access(neuronrt::device_buffer_locator(), options_->timeout)) {
        neuronrt::CachingAllocator::instance().set_shareable(true);
      }
    } catch (const neuronrt::ShmError&) {
      return;  // a peer failed during setup: this group stays on Gloo
    }
  }
  shm_ = std::move(shm);
}

ProcessGroupNeuron::~ProcessGroupNeuron() {
  shutdown();
  if (aborted_.load()) {
    // Destroying ProcessGroupGloo joins its workers, which sit in the aborted
    // collectives until the transport's timeout: that would stall whoever
    // drops the last reference (often Python, holding the GIL). An aborted
    // group's transport is left to finish on its own and leaked.
    (void)gloo_.release();
  }
}

std::chrono::milliseconds ProcessGroupNeuron::effectiveTimeout(std::chrono::milliseconds opTimeout) const {
  return opTimeout.count() > 0 ? opTimeout : options_->timeout;
}

std::string ProcessGroupNeuron::ranksString() const {
  const auto& g = options_->global_ranks_in_group;
  if (g.empty()) return c10::str("[0..", size_ - 1, "]");
  return c10::str("[", join(g, ", "), "]");
}

void ProcessGroupNeuron::checkUsable() const {
  if (aborted_.load()) {
    C10_THROW_ERROR(DistBackendError, c10::str("neuron process group '", pg_uid_,
                                               "' was aborted; create a new process group to continue"));
  }
  if (shutdown_.load()) {
    C10_THROW_ERROR(DistBackendError, c10::str("neuron process group '", pg_uid_, "' was shut down"));
  }
}

void ProcessGroupNeuron::setTimeout(std::chrono::milliseconds timeout) {
  options_->timeout = timeout;
  gloo_->setTimeout(timeout);
}

void ProcessGroupNeuron::setGroupUid(const std::string& pg_uid) {
  Backend::setGroupUid(pg_uid);
  gloo_->setGroupUid(pg_uid);
}

void ProcessGroupNeuron::setSequenceNumberForGroup() {
  gloo_->setSequenceNumberForGroup();
  seq_ = 0;
}

std::shared_ptr<void> ProcessGroupNeuron::expose(const std::vector<at::Tensor>& a,
                                                const std::vector<at::Tensor>& b) {
  const auto devices = devices_of(a, b);
  if (devices.empty()) return nullptr;
  // The transport reads and writes host views of the buffers on its own
  // threads, and our own preparation (scaled or widened scratch copies) reads
  // them now: the kernels queued on the current streams (the producers of the
  // inputs, earlier readers of the outputs) run first. A failed queued kernel
  // raises here, before anything moves.
  for (const c10::Device& d : devices) {
    at::neuron::rt_call([&] { neuronrt::current_stream(d.index()).synchronize(); });
  }
  return neuronrt::host_access();
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::launch(std::shared_ptr<void> access, OpType type,
                                                    std::chrono::milliseconds opTimeout,
                                                    std::vector<at::Tensor> outputs,
                                                    const std::function<c10::intrusive_ptr<Work>()>& run,
                                                    std::function<void()> after) {
  auto work = makeWork(type, opTimeout, std::move(outputs));
  c10::intrusive_ptr<Work> transport = run();
  track(work, std::move(transport), std::move(after), std::move(access));
  return work;
}

c10::intrusive_ptr<ProcessGroupNeuron::WorkNeuron> ProcessGroupNeuron::makeWork(OpType type,
                                                                             std::chrono::milliseconds opTimeout,
                                                                             std::vector<at::Tensor> outputs) {
  checkUsable();
  const uint64_t seq = ++seq_;
  const auto timeout = effectiveTimeout(opTimeout);
  auto devices = devices_of(outputs);
  std::string describe = c10::str("[neuron] ", opTypeToString(type), " (sequence number ", seq, ", group '", pg_uid_,
                                  "', rank ", rank_, " of ranks ", ranksString(), ", timeout ", timeout.count(),
                                  " ms)");
  auto work = c10::make_intrusive<WorkNeuron>(rank_, type, seq, std::move(describe), timeout, std::move(outputs),
                                              std::move(devices), error_);
  work->watchdog_ = watchdog_;
  return work;
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::launchShm(OpType type, std::chrono::milliseconds opTimeout,
                                                       std::vector<at::Tensor> outputs,
                                                       const std::vector<at::Tensor>& checked, const char* kernelName,
                                                       const ShmBody& body, int64_t redop) {
  auto work = makeWork(type, opTimeout, outputs);
  watch(work);  // a timeout reaches the watchdog (TORCH_NEURONX_ASYNC_ERROR_HANDLING)
  // The argument check travels with the collective's first step.
  std::vector<int64_t> words;
  std::string mismatch;
  neuronrt::ShmCheck check;
  if (checkAgreement_) {
    words = agreementWords(type, checked, {}, {}, redop);
    check = {words.data(), words.size(), [&](const int64_t* all) {
               mismatch = disagreement(words, all);
               if (!mismatch.empty()) throw neuronrt::Error(mismatch);
             }};
  }
  const auto devices = devices_of(outputs);
  std::exception_ptr error;
  try {
    std::lock_guard<std::mutex> lock(shmMutex_);
    const neuronrt::ShmCheck* c = checkAgreement_ ? &check : nullptr;
    if (devices.empty()) {
      body(work->timeout_, c);  // cpu tensors
    } else {
      // A synchronous launch: it runs after the kernels queued on the stream
      // (the inputs' producers), and the collective is done when it returns.
      neuronrt::current_stream(devices[0].index()).launch([&] { body(work->timeout_, c); }, kernelName);
    }
  } catch (...) {
    error = std::current_exception();
  }
  if (error && !mismatch.empty()) {
    // Every rank failed this check together and nothing moved: raise as
    // agree() does (the group stays usable); the work is retired unused.
    work->complete(nullptr, {});
    C10_THROW_ERROR(DistBackendError, c10::str(work->describe(), ": ", mismatch));
  }
  work->complete(error, {});
  return work;
}

std::vector<int64_t> ProcessGroupNeuron::agreementWords(OpType type, const std::vector<at::Tensor>& tensors,
                                                        const std::vector<int64_t>& inSplits,
                                                        const std::vector<int64_t>& outSplits, int64_t redop) const {
  std::vector<int64_t> p(4 + 2 * static_cast<size_t>(size_), 0);
  // The op type in the low byte, the reduce op (+1, 0 for none) above it.
  p[0] = static_cast<int64_t>(type) | ((redop + 1) << 8);
  p[1] = tensors.empty() ? -1 : static_cast<int64_t>(tensors[0].scalar_type());
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over (dtype, numel) of every tensor
  for (const auto& t : tensors) {
    p[2] += t.numel();
    hash = (hash ^ static_cast<uint64_t>(t.numel())) * 1099511628211ull;
    hash = (hash ^ static_cast<uint64_t>(t.scalar_type())) * 1099511628211ull;
  }
  p[3] = static_cast<int64_t>(hash);
  for (size_t i = 0; i < inSplits.size() && i < static_cast<size_t>(size_); ++i) p[4 + i] = inSplits[i];
  for (size_t i = 0; i < outSplits.size() && i < static_cast<size_t>(size_); ++i) p[4 + size_ + i] = outSplits[i];
  // Only all_to_all compares splits; its words say so.
  if (!inSplits.empty() || !outSplits.empty()) p[2] = -1;
  return p;
}

std::string ProcessGroupNeuron::disagreement(const std::vector<int64_t>& mine, const int64_t* all) const {
  const size_t width = mine.size();
  const bool a2a = mine[2] == -1;
  auto row = [&](int r) { return all + r * width; };
  bool ok = true;
  for (int r = 0; r < size_ && ok; ++r) {
    const int64_t* q = row(r);
    ok = q[0] == mine[0] && q[1] == mine[1] && q[2] == mine[2] && (a2a || q[3] == mine[3]);
  }
  // all_to_all: what rank i sends to j is what j expects from i.
  for (int i = 0; i < size_ && ok && a2a; ++i) {
    for (int j = 0; j < size_ && ok; ++j) ok = row(i)[4 + j] == row(j)[4 + size_ + i];
  }
  // A rank that rejected its own arguments raised a ValueError/TypeError
  // there; the others learn which kind of problem it was.
  std::string rejected;
  for (int r = 0; r < size_; ++r) {
    if (row(r)[1] == kRejected) {
      rejected += c10::str(rejected.empty() ? "" : "; ", "rank ", r, " (", arg_problem_text(row(r)[2]), ")");
    }
  }
  if (!rejected.empty()) {
    return c10::str("the collective did not run: ", rejected,
                    " rejected its arguments and raised the details there");
  }
  if (ok) return {};
  auto opName = [](int64_t w) {
    std::string name = opTypeToString(static_cast<OpType>(w & 0xff));
    if ((w >> 8) > 0) name += c10::str("(", reduce_op_name(static_cast<ReduceOp::RedOpType>((w >> 8) - 1)), ")");
    return name;
  };
  std::string ranks;
  for (int r = 0; r < size_; ++r) {
    const int64_t* q = row(r);
    ranks += c10::str("\n  rank ", r, ": ", opName(q[0]), " ",
                      q[1] < 0 ? std::string("(no tensors)") : std::string(c10::toString(static_cast<at::ScalarType>(q[1]))));
    if (q[2] == -1) {
      ranks += c10::str(" send splits [", join(std::vector<int64_t>(q + 4, q + 4 + size_), ", "), "] receive splits [",
                        join(std::vector<int64_t>(q + 4 + size_, q + 4 + 2 * size_), ", "), "] (elements)");
    } else {
      ranks += c10::str(", ", q[2], " elements");
    }
  }
  return c10::str("the ranks called mismatched collectives (op, dtype or sizes differ):", ranks);
}

void ProcessGroupNeuron::agree(OpType type, std::chrono::milliseconds opTimeout,
                               const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& inSplits,
                               const std::vector<int64_t>& outSplits, int64_t redop) {
  if (!checkAgreement_ || size_ == 1) return;
  const std::string mismatch = exchangeWords(type, opTimeout, agreementWords(type, tensors, inSplits, outSplits, redop));
  if (!mismatch.empty()) {
    const auto timeout = effectiveTimeout(opTimeout);
    C10_THROW_ERROR(DistBackendError, c10::str("[neuron] ", opTypeToString(type), " (sequence number ", seq_.load() + 1,
                                               ", group '", pg_uid_, "', rank ", rank_, " of ranks ", ranksString(),
                                               ", timeout ", timeout.count(), " ms): ", mismatch));
  }
}

void ProcessGroupNeuron::validate(OpType type, std::chrono::milliseconds opTimeout,
                                  const std::function<void()>& check) {
  ArgProblem problem = ArgProblem::Other;
  std::exception_ptr error;
  try {
    check();
    return;
  } catch (const ArgumentRejected& r) {
    problem = r.problem;
    error = r.error;
  } catch (...) {
    error = std::current_exception();
  }
  if (checkAgreement_ && size_ > 1) {
    std::vector<int64_t> words = agreementWords(type, {});
    words[1] = kRejected;
    words[2] = static_cast<int64_t>(problem);
    try {
      (void)exchangeWords(type, opTimeout, words);
    } catch (...) {  // this rank's own error says more than a failed announcement
    }
  }
  std::rethrow_exception(error);
}

std::string ProcessGroupNeuron::exchangeWords(OpType type, std::chrono::milliseconds opTimeout,
                                              const std::vector<int64_t>& p) {
  checkUsable();
  const int64_t width = static_cast<int64_t>(p.size());
  const auto timeout = effectiveTimeout(opTimeout);
  const std::string what = c10::str("[neuron] ", opTypeToString(type), " (sequence number ", seq_.load() + 1,
                                    ", group '", pg_uid_, "', rank ", rank_, " of ranks ", ranksString(),
                                    ", timeout ", timeout.count(), " ms)");
  std::string mismatch;
  if (shm_ && p.size() <= neuronrt::ShmCollectives::kExchangeWords) {
    // Through shared memory: no Gloo round trip. This is also the step a
    // rank meets when its peers' collective runs on the shared-memory path.
    neuronrt::ShmCheck check{p.data(), p.size(), [&](const int64_t* all) { mismatch = disagreement(p, all); }};
    try {
      std::lock_guard<std::mutex> lock(shmMutex_);
      shm_->exchange(check, timeout);
    } catch (const neuronrt::ShmError& e) {
      if (e.kind == neuronrt::ShmError::Kind::Timeout) handleTimeout(what);
      if (!aborted_.load()) note_error(*error_, classify(e.what()));
      C10_THROW_ERROR(DistBackendError, c10::str(what, " failed: ", e.what()));
    }
  } else {
    at::Tensor mine = at::tensor(p, at::kLong);
    std::vector<std::vector<at::Tensor>> all(1);
    for (int r = 0; r < size_; ++r) all[0].push_back(at::empty({width}, at::kLong));
    std::vector<at::Tensor> in{mine};
    AllgatherOptions ao;
    ao.timeout = timeout;
    try {
      auto fut = gloo_->allgather(all, in, ao)->getFuture();
      // Wait on the future, not the Gloo work: abort() must release this wait.
      auto state = abortWaits_;
      fut->addCallback([state](c10::ivalue::Future&) {
        { std::lock_guard<std::mutex> lock(state->mutex); }
        state->cv.notify_all();
      });
      {
        std::unique_lock<std::mutex> lock(state->mutex);
        const bool done = state->cv.wait_for(lock, std::min(timeout, kMaxTimeout),
                                             [&] { return fut->completed() || aborted_.load(); });
        if (!fut->completed()) {
          if (!done) {
            lock.unlock();
            handleTimeout(what);
          }
          C10_THROW_ERROR(DistBackendError, done ? std::string("the process group was aborted")
                                                 : c10::str("timed out after ", timeout.count(), " ms"));
        }
      }
      if (fut->hasError()) std::rethrow_exception(fut->exception_ptr());
    } catch (...) {
      const std::string msg = error_message(std::current_exception());
      if (!aborted_.load()) note_error(*error_, classify(msg));
      C10_THROW_ERROR(DistBackendError, c10::str(what, " failed: ", msg));
    }
    at::Tensor rows = at::stack(all[0]).contiguous();
    mismatch = disagreement(p, rows.data_ptr<int64_t>());
  }
  return mismatch;
}


void ProcessGroupNeuron::track(const c10::intrusive_ptr<WorkNeuron>& work, c10::intrusive_ptr<Work> transport,
                               std::function<void()> after, std::shared_ptr<void> access) {
  work->transport_ = transport;
  watch(work);
  // Collective works carry a future; complete ours from its callback (no
  // extra thread, no second waiter on the Gloo work).
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  try {
    fut = transport->getFuture();
  } catch (const c10::Error&) {
  }
  if (fut) {
    // The callback (and with it the host access) lives until the transport's
    // future completes, also when our work completed early (a timeout).
    // (`work = work`: a plain capture of the const reference would be a const
    // copy, which std::move copies; its reference would then drop outside the
    // CompletionScope, when Gloo destroys the callback.)
    fut->addCallback([work = work, after = std::move(after), access = std::move(access)](
                         c10::ivalue::Future& f) mutable {
      Waiting item{std::move(work), nullptr, std::move(after), std::move(access)};
      finish(std::move(item), f.hasError() ? f.exception_ptr() : nullptr);
    });
    return;
  }
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->items.push_back({work, std::move(transport), std::move(after), std::move(access)});
    if (!completionThread_.joinable()) completionThread_ = std::thread(&ProcessGroupNeuron::completionLoop, queue_);
  }
  queue_->cv.notify_one();
}

void ProcessGroupNeuron::finish(Waiting item, std::exception_ptr error) {
  CompletionScope scope;
  if (!scope.active()) return CompletionScope::leak(std::move(item));
  item.work->complete(error, item.after);
  item = Waiting{};  // the references drop inside the scope
}

void ProcessGroupNeuron::quiesceCompletions(std::chrono::milliseconds timeout) {
  auto& s = completion_state();
  std::unique_lock<std::mutex> lock(s.mutex);
  s.exiting = true;
  s.cv.wait_for(lock, timeout, [&] { return s.open == 0; });
}

void ProcessGroupNeuron::watch(const c10::intrusive_ptr<WorkNeuron>& work) {
  std::lock_guard<std::mutex> lock(pendingMutex_);
  if (!watchdogThread_.joinable()) watchdogThread_ = std::thread(&ProcessGroupNeuron::watchdogLoop, this);
  if (pending_.size() >= 64) {
    std::erase_if(pending_, [](const auto& w) {
      auto p = w.lock();
      return !p || p->isCompleted();
    });
  }
  pending_.emplace_back(work);
}

void ProcessGroupNeuron::completionLoop(std::shared_ptr<CompletionQueue> queue) {
  c10::setThreadName("pt_neuron_comm");
  // Works that timed out: the transport may still touch their buffers, so
  // their host access lives until it is done.
  std::vector<Waiting> lingering;
  while (true) {
    Waiting item;
    std::erase_if(lingering, [](const Waiting& w) { return w.transport->isCompleted(); });
    {
      std::unique_lock<std::mutex> lock(queue->mutex);
      queue->cv.wait(lock, [&] { return queue->stop || !queue->items.empty(); });
      if (queue->items.empty()) return;
      item = std::move(queue->items.front());
      queue->items.pop_front();
      queue->busy = true;
    }
    std::exception_ptr error;
    try {
      item.transport->wait(item.work->timeout_);
    } catch (...) {
      error = std::current_exception();
    }
    // A failed transport may still touch the buffers: keep the host access.
    if (error && item.access) lingering.push_back({nullptr, item.transport, nullptr, item.access});
    finish(std::move(item), error);
    std::lock_guard<std::mutex> lock(queue->mutex);
    queue->busy = false;
  }
}

void ProcessGroupNeuron::handleTimeout(const std::string& what) {
  note_error(*error_, ErrorType::TIMEOUT);
  if (errorHandling_ == 0) return;
  const bool exitProcess = errorHandling_ == 1 || errorHandling_ == 3;
  std::cerr << what << " timed out; TORCH_NEURONX_ASYNC_ERROR_HANDLING=" << errorHandling_
            << (exitProcess ? ": exiting the process" : ": aborting the process group")
            << " (set it to 0 to only raise DistBackendError)" << std::endl;
  if (errorHandling_ == 1 || errorHandling_ == 2) abort();
  if (exitProcess) std::_Exit(1);  // no cleanup: other threads may be stuck in the transport
}

void ProcessGroupNeuron::watchdogLoop() {
  c10::setThreadName("pt_neuron_watch");
  auto dog = watchdog_;
  while (true) {
    std::deque<std::string> reported;
    {
      std::unique_lock<std::mutex> lock(dog->mutex);
      dog->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return dog->stop || !dog->timedOut.empty(); });
      if (dog->stop) return;
      reported.swap(dog->timedOut);
    }
    for (const auto& what : reported) handleTimeout(what);
    std::vector<c10::intrusive_ptr<WorkNeuron>> late;
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(pendingMutex_);
      for (auto& w : pending_) {
        auto p = w.lock();
        if (p && !p->isCompleted() && now > p->start_ + p->timeout_) late.push_back(std::move(p));
      }
    }
    for (auto& w : late) {
      const auto error = std::make_exception_ptr(
          c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                c10::str("timed out: not completed after ", w->timeout_.count(), " ms")));
      finish({std::move(w), nullptr, nullptr, nullptr}, error);  // queues the timeout for the next round
    }
  }
}

void ProcessGroupNeuron::abort() {
  aborted_ = true;
  if (shm_) shm_->abort();  // releases callers inside a shared-memory collective
  std::vector<c10::intrusive_ptr<WorkNeuron>> pending;
  {
    std::lock_guard<std::mutex> lock(pendingMutex_);
    for (auto& w : pending_) {
      if (auto p = w.lock()) pending.push_back(std::move(p));
    }
    pending_.clear();
  }
  for (auto& w : pending) w->abort();
  {
    std::lock_guard<std::mutex> lock(abortWaits_->mutex);
  }
  abortWaits_->cv.notify_all();
  // Gloo's own abort is not called: it has none for collectives, and the
  // transport's queued works end on its timeout without holding callers.
  shutdown();
}

void ProcessGroupNeuron::shutdown() {
  if (shutdown_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(watchdog_->mutex);
    watchdog_->stop = true;
  }
  watchdog_->cv.notify_all();
  if (watchdogThread_.joinable()) {
    // abort() may run on the watchdog itself (error handling 1 and 2).
    if (watchdogThread_.get_id() == std::this_thread::get_id()) {
      watchdogThread_.detach();
    } else {
      watchdogThread_.join();
    }
  }
  bool blocked = false;
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->stop = true;
    // After an abort the thread may sit in a wait on a dead peer: leave it
    // (it owns the queue) rather than block shutdown until the timeout.
    blocked = aborted_.load() && (queue_->busy || !queue_->items.empty());
  }
  queue_->cv.notify_all();
  if (completionThread_.joinable()) {
    if (blocked) {
      completionThread_.detach();
    } else {
      completionThread_.join();
    }
  }
}

c10::intrusive_ptr<Backend> ProcessGroupNeuron::split(const c10::intrusive_ptr<Store>& store,
                                                      const std::vector<int>& ranks,
                                                      const c10::intrusive_ptr<Backend::Options>& opts) {
  checkUsable();
  const std::string groupName = opts ? opts->group_name : std::string();
  const auto timeout = opts ? opts->timeout : options_->timeout;
  const std::string key = c10::str(groupName, "|", join(ranks, ","));
  std::lock_guard<std::mutex> lock(splitMutex_);
  if (!lastSplitKey_.empty() && key == lastSplitKey_) return lastSplit_;

  const auto childStore = attempt_store(store);
  c10::intrusive_ptr<Backend> childGloo;
  {
    // Gloo warns that our options are not its own and uses its defaults,
    // which is what we want (the timeout is set right after).
    SilentWarnings silent;
    c10::WarningUtils::WarningHandlerGuard guard(&silent);
    childGloo = gloo_->split(c10::make_intrusive<PrefixStore>("gloo/", childStore), ranks, nullptr);
  }
  c10::intrusive_ptr<Backend> child;
  if (childGloo) {
    childGloo->setTimeout(timeout);
    auto childOpts = Options::create(timeout);
    childOpts->group_name = groupName;
    if (opts) childOpts->group_desc = opts->group_desc;
    for (int r : ranks) {
      const auto& g = options_->global_ranks_in_group;
      childOpts->global_ranks_in_group.push_back(g.empty() ? static_cast<uint64_t>(r) : g.at(r));
    }
    child = c10::make_intrusive<ProcessGroupNeuron>(childGloo, childGloo->getRank(), childGloo->getSize(),
                                                    childOpts, childStore);
  }
  lastSplitKey_ = key;
  lastSplit_ = child;
  return child;
}

// ---- collectives -----------------------------------------------------------------
//
// Each collective first checks this rank's own arguments (validate(): a bad
// one raises ValueError/TypeError here and is announced to the peers, which
// raise DistBackendError), then the ranks compare what they pass (agree(), or
// the first step of a shared-memory collective), then it runs. Which path a
// collective takes depends only on what the ranks compared (op, dtype, sizes),
// never on local layout such as contiguity: ranks on different paths would
// wait for each other until the timeout.

namespace {

// A contiguous flat byte view of host tensor `h` (a copy if `h` is not
// contiguous), for collectives that move bytes through scratch buffers.
at::Tensor flat_bytes(const at::Tensor& h) {
  return h.contiguous().reshape({-1}).view(at::kByte);
}

// Where this rank's tensors disagree with the shapes `want` (per list, per
// tensor: numel and dtype of the corresponding input); empty if they fit.
std::string list_layout_problem(const std::vector<std::vector<at::Tensor>>& lists, size_t count,
                                const std::function<const at::Tensor&(size_t list, size_t i)>& want,
                                size_t perList, ArgProblem* problem) {
  if (lists.size() != count) {
    *problem = ArgProblem::ListLength;
    return c10::str("expected ", count, " lists, got ", lists.size());
  }
  for (size_t l = 0; l < lists.size(); ++l) {
    if (lists[l].size() != perList) {
      *problem = ArgProblem::ListLength;
      return c10::str("list ", l, " has ", lists[l].size(), " tensors, expected ", perList);
    }
    for (size_t i = 0; i < perList; ++i) {
      const at::Tensor& o = lists[l][i];
      const at::Tensor& w = want(l, i);
      if (o.scalar_type() != w.scalar_type()) {
        *problem = ArgProblem::Dtype;
        return c10::str("output [", l, "][", i, "] is ", o.scalar_type(), ", its input ", w.scalar_type());
      }
      if (o.numel() != w.numel()) {
        *problem = ArgProblem::Size;
        return c10::str("output [", l, "][", i, "] has ", o.numel(), " elements, its input ", w.numel());
      }
    }
  }
  return {};
}

}  // namespace

c10::intrusive_ptr<Work> ProcessGroupNeuron::broadcast(std::vector<at::Tensor>& tensors,
                                                       const BroadcastOptions& opts) {
  validate(OpType::BROADCAST, opts.timeout, [&] {
    check_nonempty("broadcast", tensors, "tensors");
    check_same_device("broadcast", {{&tensors, "tensor"}});
    if (opts.rootRank < 0 || opts.rootRank >= size_) {
      reject_value(ArgProblem::Other, "broadcast: invalid root rank ", opts.rootRank, " for group size ", size_);
    }
  });
  agree(OpType::BROADCAST, opts.timeout, tensors);
  auto access = expose(tensors);
  auto host = to_host(tensors);
  return launch(std::move(access), OpType::BROADCAST, opts.timeout, tensors, [&] { return gloo_->broadcast(host, opts); });
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::allreduce(std::vector<at::Tensor>& tensors,
                                                       const AllreduceOptions& opts) {
  validate(OpType::ALLREDUCE, opts.timeout, [&] {
    check_nonempty("all_reduce", tensors, "tensors");
    check_same_device("all_reduce", {{&tensors, "tensor"}});
    check_reduction_arg(tensors, opts.reduceOp, "all_reduce");
  });
  const int64_t redop = opts.reduceOp.op_;
  if (shm_ && tensors.size() == 1 && shm_reduces(tensors[0], opts.reduceOp)) {
    return launchShm(OpType::ALLREDUCE, opts.timeout, tensors, tensors, "c10d::allreduce_ (shm)",
                     [this, t = tensors[0], op = opts.reduceOp](std::chrono::milliseconds timeout,
                                                                const neuronrt::ShmCheck* check) {
                       at::Tensor host = host_view(t);
                       at::Tensor in = reduction_input(host, op).contiguous();
                       shm_->all_reduce(in.data_ptr(), static_cast<size_t>(in.numel()), *shm_dtype(in.scalar_type()),
                                        *shm_op(op.op_), timeout, check);
                       copy_back({host}, {in})();
                     },
                     redop);
  }
  agree(OpType::ALLREDUCE, opts.timeout, tensors, {}, {}, redop);
  auto access = expose(tensors);
  auto host = host_view(tensors);
  auto in = reduction_input(host, opts.reduceOp);
  AllreduceOptions o = opts;
  o.reduceOp = gloo_op(opts.reduceOp);
  return launch(std::move(access), OpType::ALLREDUCE, opts.timeout, tensors, [&] { return gloo_->allreduce(in, o); },
                copy_back(host, in));
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const AllreduceCoalescedOptions& opts) {
  validate(OpType::ALLREDUCE_COALESCED, opts.timeout, [&] {
    check_nonempty("all_reduce_coalesced", tensors, "tensors");
    check_same_device("all_reduce_coalesced", {{&tensors, "tensor"}});
    check_reduction_arg(tensors, opts.reduceOp, "all_reduce_coalesced");
  });
  agree(OpType::ALLREDUCE_COALESCED, opts.timeout, tensors, {}, {}, opts.reduceOp.op_);
  auto access = expose(tensors);
  auto host = host_view(tensors);
  auto in = reduction_input(host, opts.reduceOp);
  AllreduceCoalescedOptions o = opts;
  o.reduceOp = gloo_op(opts.reduceOp);
  return launch(std::move(access), OpType::ALLREDUCE_COALESCED, opts.timeout, tensors,
                [&] { return gloo_->allreduce_coalesced(in, o); }, copy_back(host, in));
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::reduce(std::vector<at::Tensor>& tensors, const ReduceOptions& opts) {
  validate(OpType::REDUCE, opts.timeout, [&] {
    check_nonempty("reduce", tensors, "tensors");
    check_same_device("reduce", {{&tensors, "tensor"}});
    if (opts.rootRank < 0 || opts.rootRank >= size_) {
      reject_value(ArgProblem::Other, "reduce: invalid root rank ", opts.rootRank, " for group size ", size_);
    }
    check_reduction_arg(tensors, opts.reduceOp, "reduce");
  });
  const int64_t redop = opts.reduceOp.op_;
  // Only the root receives the result; the other ranks' tensors stay as they
  // were (NCCL's contract). Gloo's reduce works in place through every
  // rank's buffer and would leave partial results there, so a non-root rank
  // hands the transport a scratch: the scaled or widened copy when there is
  // one anyway, else one copy of its input.
  const bool root = opts.rootRank == rank_;
  auto input_for = [root](const at::Tensor& host, const ReduceOp& op) {
    at::Tensor in = reduction_input(host, op);
    if (!root && in.is_same(host)) in = host.clone(at::MemoryFormat::Contiguous);
    return in;
  };
  if (shm_ && tensors.size() == 1 && shm_reduces(tensors[0], opts.reduceOp)) {
    // An all_reduce whose result the non-roots drop (their scratch).
    return launchShm(OpType::REDUCE, opts.timeout, tensors, tensors, "c10d::reduce_ (shm)",
                     [this, t = tensors[0], op = opts.reduceOp, root, input_for](std::chrono::milliseconds timeout,
                                                                                 const neuronrt::ShmCheck* check) {
                       at::Tensor host = host_view(t);
                       at::Tensor in = input_for(host, op).contiguous();
                       shm_->all_reduce(in.data_ptr(), static_cast<size_t>(in.numel()), *shm_dtype(in.scalar_type()),
                                        *shm_op(op.op_), timeout, check);
                       if (root) copy_back({host}, {in})();
                     },
                     redop);
  }
  agree(OpType::REDUCE, opts.timeout, tensors, {}, {}, redop);
  auto access = expose(tensors);
  auto host = host_view(tensors);
  std::vector<at::Tensor> in;
  for (const auto& h : host) in.push_back(input_for(h, opts.reduceOp));
  ReduceOptions o = opts;
  o.reduceOp = gloo_op(opts.reduceOp);
  auto after = root ? copy_back(host, in) : std::function<void()>([in] {});
  return launch(std::move(access), OpType::REDUCE, opts.timeout, tensors, [&] { return gloo_->reduce(in, o); },
                std::move(after));
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const AllgatherOptions& opts) {
  constexpr const char* op = "all_gather";
  validate(OpType::ALLGATHER, opts.timeout, [&] {
    if (inputs.size() != 1) reject_value(ArgProblem::ListLength, op, ": takes one input tensor, got ", inputs.size());
    if (outputs.size() != 1) {
      reject_value(ArgProblem::ListLength, op, ": takes one output tensor list, got ", outputs.size());
    }
    if (static_cast<int>(outputs[0].size()) != size_) {
      reject_value(ArgProblem::ListLength, op, ": invalid output tensor list (expected length ", size_,
                   ", the group size, got ", outputs[0].size(), ")");
    }
    check_same_device(op, {{&inputs, "input"}, {&outputs[0], "output"}});
    for (int r = 0; r < size_; ++r) {
      check_dtype(op, outputs[0][r], c10::str("output ", r), inputs[0].scalar_type(), "input");
    }
    if (outputs[0][rank_].numel() != inputs[0].numel()) {
      reject_value(ArgProblem::Size, op, ": output ", rank_, " (this rank's own slot) must have the input's size, got ",
                   outputs[0][rank_].sizes(), " and ", inputs[0].sizes());
    }
  });
  // The ranks compare the output lists: rank r's input fills output r.
  const std::vector<at::Tensor>& outs = outputs[0];
  bool even = true;
  for (const auto& o : outs) even = even && o.numel() == inputs[0].numel();
  if (!even) return allgatherUneven(outs, inputs[0], opts);
  if (shm_ && shm_moves(inputs[0])) {
    return launchShm(OpType::ALLGATHER, opts.timeout, outs, outs, "c10d::allgather_ (shm)",
                     [this, outs, input = inputs[0]](std::chrono::milliseconds timeout,
                                                     const neuronrt::ShmCheck* check) {
                       at::Tensor in = host_view(input).contiguous();
                       std::vector<at::Tensor> hostOuts = host_view(outs);
                       // Non-contiguous outputs are filled through a contiguous scratch.
                       std::vector<at::Tensor> staged(hostOuts.size());
                       std::vector<void*> ptrs;
                       for (size_t r = 0; r < hostOuts.size(); ++r) {
                         if (!hostOuts[r].is_contiguous()) staged[r] = at::empty(hostOuts[r].sizes(), hostOuts[r].options());
                         ptrs.push_back(staged[r].defined() ? staged[r].data_ptr() : hostOuts[r].data_ptr());
                       }
                       shm_->all_gather(in.data_ptr(), ptrs.data(), static_cast<size_t>(in.numel()) * in.element_size(),
                                        timeout, check);
                       for (size_t r = 0; r < hostOuts.size(); ++r) {
                         if (staged[r].defined()) hostOuts[r].copy_(staged[r]);
                       }
                     });
  }
  agree(OpType::ALLGATHER, opts.timeout, outs);
  auto access = expose(outs, inputs);
  auto hostOut = to_host(outputs);
  auto hostIn = to_host(inputs);
  return launch(std::move(access), OpType::ALLGATHER, opts.timeout, outs,
                [&] { return gloo_->allgather(hostOut, hostIn, opts); });
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::allgatherUneven(const std::vector<at::Tensor>& outs,
                                                             const at::Tensor& input, const AllgatherOptions& opts) {
  // Outputs of different sizes (NCCL gathers them; Gloo refuses): every rank
  // pads its input to the largest output's bytes, the padded blocks are
  // gathered as bytes, and each block's leading bytes go to its output.
  int64_t block = 0;
  for (const auto& o : outs) block = std::max<int64_t>(block, o.numel() * static_cast<int64_t>(o.element_size()));
  auto copy_out = [outs](const at::Tensor& gathered, int64_t blockBytes) {
    std::vector<at::Tensor> hostOuts = host_view(outs);
    for (size_t r = 0; r < hostOuts.size(); ++r) {
      at::Tensor& o = hostOuts[r];
      if (o.numel() == 0) continue;
      const int64_t bytes = o.numel() * static_cast<int64_t>(o.element_size());
      o.copy_(gathered.narrow(0, static_cast<int64_t>(r) * blockBytes, bytes).view(o.scalar_type()).view(o.sizes()));
    }
  };
  auto padded = [block](const at::Tensor& in) {
    at::Tensor p = at::zeros({block}, at::kByte);
    at::Tensor b = flat_bytes(host_view(in));
    p.narrow(0, 0, b.numel()).copy_(b);
    return p;
  };
  if (shm_) {
    return launchShm(OpType::ALLGATHER, opts.timeout, outs, outs, "c10d::allgather_ (shm, uneven)",
                     [this, input, block, padded, copy_out](std::chrono::milliseconds timeout,
                                                            const neuronrt::ShmCheck* check) {
                       at::Tensor in = padded(input);
                       at::Tensor out = at::empty({block * size_}, at::kByte);
                       std::vector<void*> ptrs;
                       for (int r = 0; r < size_; ++r) ptrs.push_back(static_cast<uint8_t*>(out.data_ptr()) + r * block);
                       shm_->all_gather(in.data_ptr(), ptrs.data(), static_cast<size_t>(block), timeout, check);
                       copy_out(out, block);
                     });
  }
  agree(OpType::ALLGATHER, opts.timeout, outs);
  auto access = expose(outs, {input});
  at::Tensor in = padded(input);
  at::Tensor out = at::empty({block * size_}, at::kByte);
  return launch(std::move(access), OpType::ALLGATHER, opts.timeout, outs,
                [&] { return gloo_->_allgather_base(out, in, opts); }, [copy_out, out, in, block] { copy_out(out, block); });
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const AllgatherOptions& opts) {
  constexpr const char* op = "all_gather_into_tensor";
  validate(OpType::_ALLGATHER_BASE, opts.timeout, [&] {
    const std::vector<at::Tensor> in{input}, out{output};
    check_same_device(op, {{&in, "input"}, {&out, "output"}});
    check_dtype(op, output, "output tensor", input.scalar_type(), "input tensor");
    if (output.numel() != input.numel() * size_) {
      reject_value(ArgProblem::Size, op, ": output tensor size must be equal to world_size times input tensor size (",
                   output.sizes(), " vs ", size_, " x ", input.sizes(), ")");
    }
  });
  if (shm_ && shm_moves(input)) {
    return launchShm(OpType::_ALLGATHER_BASE, opts.timeout, {output}, {input}, "c10d::_allgather_base_ (shm)",
                     [this, output, input](std::chrono::milliseconds timeout, const neuronrt::ShmCheck* check) {
                       at::Tensor in = host_view(input).contiguous();
                       at::Tensor hostOut = host_view(output);
                       at::Tensor out = hostOut.is_contiguous() ? hostOut : at::empty_like(hostOut, at::MemoryFormat::Contiguous);
                       const size_t bytes = static_cast<size_t>(in.numel()) * in.element_size();
                       std::vector<void*> outs;
                       for (int r = 0; r < size_; ++r) outs.push_back(static_cast<char*>(out.data_ptr()) + r * bytes);
                       shm_->all_gather(in.data_ptr(), outs.data(), bytes, timeout, check);
                       if (!out.is_same(hostOut)) hostOut.copy_(out);
                     });
  }
  agree(OpType::_ALLGATHER_BASE, opts.timeout, {input});
  auto access = expose({output}, {input});
  auto hostOut = to_host(output);
  auto hostIn = to_host(input);
  // The output is any contiguous tensor of world x input elements (as NCCL
  // takes it; SyncBatchNorm passes [1, world * n]). Gloo splits it along
  // dim 0, so it gets the flat views.
  if (hostOut.is_contiguous() && hostIn.is_contiguous()) {
    hostOut = hostOut.view({-1});
    hostIn = hostIn.view({-1});
  }
  return launch(std::move(access), OpType::_ALLGATHER_BASE, opts.timeout, {output},
                [&] { return gloo_->_allgather_base(hostOut, hostIn, opts); });
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const AllgatherOptions& opts) {
  constexpr const char* op = "all_gather_coalesced";
  // torch.distributed documents (and Gloo implements) output_tensor_lists
  // indexed [rank][i], i the input. The vendor product indexes them
  // [i][rank]; that layout is accepted too when only it fits the shapes
  // (when both fit, e.g. as many equal-shaped inputs as ranks, torch's wins).
  std::vector<std::vector<at::Tensor>> byRank;
  validate(OpType::ALLGATHER_COALESCED, opts.timeout, [&] {
    check_nonempty(op, inputs, "input_tensor_list");
    const size_t n = inputs.size(), world = static_cast<size_t>(size_);
    ArgProblem problem = ArgProblem::Other, unused = ArgProblem::Other;
    const std::string torchLayout = list_layout_problem(
        outputs, world, [&](size_t, size_t i) -> const at::Tensor& { return inputs[i]; }, n, &problem);
    if (torchLayout.empty()) {
      byRank = outputs;
    } else if (list_layout_problem(outputs, n, [&](size_t i, size_t) -> const at::Tensor& { return inputs[i]; },
                                   world, &unused).empty()) {
      byRank.assign(world, {});
      for (size_t r = 0; r < world; ++r) {
        for (size_t i = 0; i < n; ++i) byRank[r].push_back(outputs[i][r]);
      }
    } else {
      const std::string msg = c10::str(op, ": output_tensor_lists must hold ", world, " lists (one per rank) of ", n,
                                       " tensors matching the inputs' dtypes and sizes: ", torchLayout);
      if (problem == ArgProblem::Dtype) reject_type(problem, msg);
      reject_value(problem, msg);
    }
    const std::vector<at::Tensor> flat = flatten(byRank);
    check_same_device(op, {{&inputs, "input"}, {&flat, "output"}});
  });
  agree(OpType::ALLGATHER_COALESCED, opts.timeout, inputs);
  const std::vector<at::Tensor> flatOut = flatten(byRank);
  auto access = expose(flatOut, inputs);
  auto hostOut = to_host(byRank);
  auto hostIn = to_host(inputs);
  // Gloo checks each output's shape against its input: hand it flat views.
  for (auto& l : hostOut) {
    for (size_t i = 0; i < l.size(); ++i) {
      if (l[i].is_contiguous() && hostIn[i].is_contiguous()) l[i] = l[i].view({-1});
    }
  }
  for (auto& t : hostIn) {
    if (t.is_contiguous()) t = t.view({-1});
  }
  return launch(std::move(access), OpType::ALLGATHER_COALESCED, opts.timeout, flatOut,
                [&] { return gloo_->allgather_coalesced(hostOut, hostIn, opts); });
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const AllgatherOptions& opts) {
  constexpr const char* op = "all_gather_into_tensor_coalesced";
  validate(OpType::COALESCED, opts.timeout, [&] {
    check_nonempty(op, inputs, "inputs");
    if (outputs.size() != inputs.size()) {
      reject_value(ArgProblem::ListLength, op, ": needs one output per input, got ", outputs.size(), " outputs and ",
                   inputs.size(), " inputs");
    }
    check_same_device(op, {{&inputs, "input"}, {&outputs, "output"}});
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_dtype(op, outputs[i], c10::str("output tensor ", i), inputs[i].scalar_type(), "input tensor");
      if (outputs[i].numel() != inputs[i].numel() * size_) {
        reject_value(ArgProblem::Size, op, ": output tensor size must be equal to world_size times input tensor size",
                     " (output ", i, " is ", outputs[i].sizes(), ", input ", inputs[i].sizes(), ", world size ", size_,
                     ")");
      }
    }
  });
  agree(OpType::COALESCED, opts.timeout, inputs);
  auto access = expose(outputs, inputs);
  auto hostOut = to_host(outputs);
  auto hostIn = to_host(inputs);
  // Any contiguous output of world x input elements, as _allgather_base.
  for (size_t i = 0; i < hostOut.size(); ++i) {
    if (hostOut[i].is_contiguous() && hostIn[i].is_contiguous()) {
      hostOut[i] = hostOut[i].view({-1});
      hostIn[i] = hostIn[i].view({-1});
    }
  }
  return launch(std::move(access), OpType::COALESCED, opts.timeout, outputs,
                [&] { return gloo_->allgather_into_tensor_coalesced(hostOut, hostIn, opts); });
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs, const GatherOptions& opts) {
  validate(OpType::GATHER, opts.timeout, [&] {
    check_rooted("gather", rank_, size_, opts.rootRank, "destination", inputs, "input", outputs, "output",
                 "gather_list");
  });
  agree(OpType::GATHER, opts.timeout, inputs);
  auto access = expose(flatten(outputs), inputs);
  auto hostOut = to_host(outputs);
  auto hostIn = to_host(inputs);
  return launch(std::move(access), OpType::GATHER, opts.timeout, flatten(outputs),
                [&] { return gloo_->gather(hostOut, hostIn, opts); });
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const ScatterOptions& opts) {
  validate(OpType::SCATTER, opts.timeout, [&] {
    check_rooted("scatter", rank_, size_, opts.rootRank, "source", outputs, "output", inputs, "input",
                 "scatter_list");
  });
  agree(OpType::SCATTER, opts.timeout, outputs);
  auto access = expose(outputs, flatten(inputs));
  auto hostOut = to_host(outputs);
  auto hostIn = to_host(inputs);
  return launch(std::move(access), OpType::SCATTER, opts.timeout, outputs, [&] { return gloo_->scatter(hostOut, hostIn, opts); });
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const ReduceScatterOptions& opts) {
  constexpr const char* op = "reduce_scatter";
  validate(OpType::REDUCE_SCATTER, opts.timeout, [&] {
    if (outputs.size() != 1 || inputs.size() != 1) {
      reject_value(ArgProblem::ListLength, op, ": takes one output tensor and one list of inputs");
    }
    if (static_cast<int>(inputs[0].size()) != size_) {
      reject_value(ArgProblem::ListLength, op, ": needs ", size_, " input tensors (one per rank), got ",
                   inputs[0].size());
    }
    check_same_device(op, {{&outputs, "output"}, {&inputs[0], "input"}});
    for (size_t r = 0; r < inputs[0].size(); ++r) {
      check_dtype(op, inputs[0][r], c10::str("input ", r), outputs[0].scalar_type(), "output");
      if (inputs[0][r].numel() != outputs[0].numel()) {
        reject_value(ArgProblem::Size, op, ": input ", r, " must have the output's size, got ", inputs[0][r].sizes(),
                     " and ", outputs[0].sizes());
      }
    }
    check_reduction_arg(inputs[0], opts.reduceOp, op);
  });
  const int64_t redop = opts.reduceOp.op_;
  if (shm_ && shm_reduces(outputs[0], opts.reduceOp)) {
    return launchShm(OpType::REDUCE_SCATTER, opts.timeout, outputs, outputs, "c10d::reduce_scatter_ (shm)",
                     [this, output = outputs[0], ins = inputs[0], op = opts.reduceOp](std::chrono::milliseconds timeout,
                                                                                      const neuronrt::ShmCheck* check) {
                       std::vector<at::Tensor> flat;
                       for (const auto& t : host_view(ins)) flat.push_back(t.reshape({-1}));
                       at::Tensor in = reduction_input(at::cat(flat), op).contiguous();
                       at::Tensor hostOut = host_view(output);
                       at::Tensor out = at::empty({hostOut.numel()}, hostOut.options().dtype(in.scalar_type()));
                       shm_->reduce_scatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                                            *shm_dtype(in.scalar_type()), *shm_op(op.op_), timeout, check);
                       hostOut.copy_(out.view(hostOut.sizes()));
                     },
                     redop);
  }
  agree(OpType::REDUCE_SCATTER, opts.timeout, outputs, {}, {}, redop);
  auto access = expose(outputs, flatten(inputs));
  // The list form runs as the flat form over one contiguous scratch input
  // (scaled or widened as needed) and a scratch output copied back.
  std::vector<at::Tensor> flat;
  for (const auto& t : host_view(inputs[0])) flat.push_back(t.reshape({-1}));
  at::Tensor in = reduction_input(at::cat(flat), opts.reduceOp);
  at::Tensor hostOut = host_view(outputs[0]);
  at::Tensor out = at::empty({hostOut.numel()}, hostOut.options().dtype(in.scalar_type()));
  ReduceScatterOptions o = opts;
  o.reduceOp = gloo_op(opts.reduceOp);
  return launch(std::move(access),
      OpType::REDUCE_SCATTER, opts.timeout, outputs, [&] { return gloo_->_reduce_scatter_base(out, in, o); },
      [hostOut, out, in]() mutable { hostOut.copy_(out.view(hostOut.sizes())); });
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const ReduceScatterOptions& opts) {
  constexpr const char* op = "reduce_scatter_tensor";
  validate(OpType::_REDUCE_SCATTER_BASE, opts.timeout, [&] {
    const std::vector<at::Tensor> in{input}, out{output};
    check_same_device(op, {{&in, "input"}, {&out, "output"}});
    check_dtype(op, input, "input tensor", output.scalar_type(), "output tensor");
    if (input.numel() != output.numel() * size_) {
      reject_value(ArgProblem::Size, op, ": input tensor must be the same size as output size times world size (",
                   input.sizes(), " vs ", size_, " x ", output.sizes(), ")");
    }
    check_reduction_arg({input}, opts.reduceOp, op);
  });
  const int64_t redop = opts.reduceOp.op_;
  if (shm_ && shm_reduces(input, opts.reduceOp)) {
    return launchShm(OpType::_REDUCE_SCATTER_BASE, opts.timeout, {output}, {input},
                     "c10d::_reduce_scatter_base_ (shm)",
                     [this, output, input, op = opts.reduceOp](std::chrono::milliseconds timeout,
                                                               const neuronrt::ShmCheck* check) {
                       at::Tensor hostOut = host_view(output);
                       at::Tensor in = reduction_input(host_view(input), op).contiguous();
                       const bool direct = in.scalar_type() == hostOut.scalar_type() && hostOut.is_contiguous();
                       at::Tensor out = direct ? hostOut : at::empty({hostOut.numel()}, in.options());
                       shm_->reduce_scatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(hostOut.numel()),
                                            *shm_dtype(in.scalar_type()), *shm_op(op.op_), timeout, check);
                       if (!direct) hostOut.copy_(out.view(hostOut.sizes()));
                     },
                     redop);
  }
  agree(OpType::_REDUCE_SCATTER_BASE, opts.timeout, {input}, {}, {}, redop);
  auto access = expose({output}, {input});
  at::Tensor hostOut = host_view(output);
  at::Tensor in = reduction_input(host_view(input), opts.reduceOp);
  at::Tensor out = in.scalar_type() == hostOut.scalar_type() ? hostOut : hostOut.to(in.scalar_type());
  ReduceScatterOptions o = opts;
  o.reduceOp = gloo_op(opts.reduceOp);
  return launch(std::move(access), OpType::_REDUCE_SCATTER_BASE, opts.timeout, {output},
                [&] { return gloo_->_reduce_scatter_base(out, in, o); }, copy_back({hostOut, in}, {out, in}));
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const ReduceScatterOptions& opts) {
  constexpr const char* op = "reduce_scatter_tensor_coalesced";
  validate(OpType::REDUCE_SCATTER_TENSOR_COALESCED, opts.timeout, [&] {
    check_nonempty(op, inputs, "inputs");
    if (outputs.size() != inputs.size()) {
      reject_value(ArgProblem::ListLength, op, ": needs one output per input, got ", outputs.size(), " outputs and ",
                   inputs.size(), " inputs");
    }
    check_same_device(op, {{&inputs, "input"}, {&outputs, "output"}});
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_dtype(op, inputs[i], c10::str("input tensor ", i), outputs[i].scalar_type(), "output tensor");
      if (inputs[i].numel() != outputs[i].numel() * size_) {
        reject_value(ArgProblem::Size, op, ": input tensor must be the same size as output size times world size",
                     " (input ", i, " is ", inputs[i].sizes(), ", output ", outputs[i].sizes(), ", world size ", size_,
                     ")");
      }
    }
    check_reduction_arg(inputs, opts.reduceOp, op);
  });
  agree(OpType::REDUCE_SCATTER_TENSOR_COALESCED, opts.timeout, inputs, {}, {}, opts.reduceOp.op_);
  auto access = expose(outputs, inputs);
  auto hostOut = host_view(outputs);
  auto in = reduction_input(host_view(inputs), opts.reduceOp);
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < hostOut.size(); ++i) {
    const auto dtype = in[i].scalar_type();
    out.push_back(dtype == hostOut[i].scalar_type() ? hostOut[i] : hostOut[i].to(dtype));
  }
  auto keep = in;
  auto after = copy_back(hostOut, out);
  ReduceScatterOptions o = opts;
  o.reduceOp = gloo_op(opts.reduceOp);
  return launch(std::move(access), OpType::REDUCE_SCATTER_TENSOR_COALESCED, opts.timeout, outputs,
                [&] { return gloo_->reduce_scatter_tensor_coalesced(out, in, o); },
                [after, keep]() { after(); });
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& outputSplits,
                                                           std::vector<int64_t>& inputSplits,
                                                           const AllToAllOptions& opts) {
  constexpr const char* op = "all_to_all_single";
  validate(OpType::ALLTOALL_BASE, opts.timeout, [&] {
    const std::vector<at::Tensor> in{input}, out{output};
    check_same_device(op, {{&in, "input"}, {&out, "output"}});
    check_dtype(op, output, "output tensor", input.scalar_type(), "input tensor");
    check_splits(op, input, inputSplits, size_, "input");
    check_splits(op, output, outputSplits, size_, "output");
  });
  // Splits in elements (dimension-0 rows times row size; none = equal).
  auto elements = [&](const at::Tensor& t, const std::vector<int64_t>& splits) {
    const int64_t row = t.dim() == 0 || t.size(0) == 0 ? 0 : t.numel() / t.size(0);
    std::vector<int64_t> out;
    for (int r = 0; r < size_; ++r) out.push_back(splits.empty() ? t.numel() / size_ : splits.at(r) * row);
    return out;
  };
  agree(OpType::ALLTOALL_BASE, opts.timeout, {input}, elements(input, inputSplits), elements(output, outputSplits));
  auto access = expose({output}, {input});
  auto hostOut = to_host(output);
  auto hostIn = to_host(input);
  return launch(std::move(access), OpType::ALLTOALL_BASE, opts.timeout, {output},
                [&] { return gloo_->alltoall_base(hostOut, hostIn, outputSplits, inputSplits, opts); });
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs, const AllToAllOptions& opts) {
  constexpr const char* op = "all_to_all";
  validate(OpType::ALLTOALL, opts.timeout, [&] {
    if (static_cast<int>(outputs.size()) != size_ || static_cast<int>(inputs.size()) != size_) {
      reject_value(ArgProblem::ListLength, op, ": needs ", size_, " input and output tensors (the group size), got ",
                   inputs.size(), " and ", outputs.size());
    }
    check_same_device(op, {{&inputs, "input"}, {&outputs, "output"}});
    for (int r = 0; r < size_; ++r) {
      check_dtype(op, inputs[r], c10::str("input ", r), outputs[0].scalar_type(), "outputs");
      check_dtype(op, outputs[r], c10::str("output ", r), outputs[0].scalar_type(), "outputs");
    }
  });
  {
    std::vector<int64_t> in, out;
    for (const auto& t : inputs) in.push_back(t.numel());
    for (const auto& t : outputs) out.push_back(t.numel());
    agree(OpType::ALLTOALL, opts.timeout, {inputs.at(0)}, in, out);
  }
  auto access = expose(outputs, inputs);
  // The list form runs as the flat form over one contiguous buffer each way.
  std::vector<at::Tensor> flatIn;
  std::vector<int64_t> inSplits, outSplits;
  for (const auto& t : to_host(inputs)) {
    flatIn.push_back(t.reshape({-1}));
    inSplits.push_back(t.numel());
  }
  auto hostOuts = to_host(outputs);
  int64_t total = 0;
  for (const auto& t : hostOuts) {
    outSplits.push_back(t.numel());
    total += t.numel();
  }
  at::Tensor in = at::cat(flatIn);
  at::Tensor out = at::empty({total}, hostOuts[0].options());
  return launch(
      std::move(access), OpType::ALLTOALL, opts.timeout, outputs,
      [&] { return gloo_->alltoall_base(out, in, outSplits, inSplits, opts); },
      [hostOuts, out, outSplits, in]() mutable {
        int64_t offset = 0;
        for (size_t i = 0; i < hostOuts.size(); ++i) {
          hostOuts[i].copy_(out.narrow(0, offset, outSplits[i]).view(hostOuts[i].sizes()));
          offset += outSplits[i];
        }
      });
}

// p2p argument check. Gloo moves p2p messages as bytes: a receive buffer
// larger than the message or of another dtype silently gets garbage. So
// (unless TORCH_NEURONX_COLLECTIVE_CHECK=0) each send is preceded by a small
// header (sender, dtype, numel, sizes) on a reserved tag, and the receiver
// compares it with its buffer once the message is in, raising
// DistBackendError on a mismatch. Both are posted eagerly, in the caller's
// order, on two tags that are each FIFO per pair of ranks, so several
// messages in flight between two ranks stay matched and no wait depends on
// another rank's completion thread. (A message larger than the receive
// buffer still makes Gloo abort the receiving process: Gloo checks that
// before anything of ours runs.)
namespace {
constexpr int64_t kP2PMagic = 0x4e52505032505031;  // "NRPP2PP1"
constexpr int kP2PMaxDims = 8;
constexpr int64_t kP2PHeaderWords = 5 + kP2PMaxDims;  // magic, sender, dtype, numel, ndim, sizes
constexpr int kP2PHeaderTagBit = 1 << 30;

int p2p_header_tag(int tag) {
  TORCH_CHECK_VALUE(tag >= 0 && tag < kP2PHeaderTagBit, "neuron backend: p2p tags must be in [0, 2^30) (the ",
                    "argument check reserves the rest), got ", tag,
                    "; TORCH_NEURONX_COLLECTIVE_CHECK=0 lifts the limit");
  return tag | kP2PHeaderTagBit;
}

at::Tensor p2p_header(const at::Tensor& t, int rank) {
  at::Tensor h = at::zeros({kP2PHeaderWords}, at::kLong);
  int64_t* p = h.data_ptr<int64_t>();
  p[0] = kP2PMagic;
  p[1] = rank;
  p[2] = static_cast<int64_t>(t.scalar_type());
  p[3] = t.numel();
  p[4] = t.dim();
  for (int64_t d = 0; d < t.dim() && d < kP2PMaxDims; ++d) p[5 + d] = t.size(d);
  return h;
}

std::string p2p_describe(const int64_t* p) {
  std::vector<int64_t> sizes(p + 5, p + 5 + std::min<int64_t>(p[4], kP2PMaxDims));
  return c10::str(static_cast<at::ScalarType>(p[2]), c10::IntArrayRef(sizes), p[4] > kP2PMaxDims ? "..." : "",
                  " (", p[3], " elements)");
}
}  // namespace

c10::intrusive_ptr<Work> ProcessGroupNeuron::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  auto access = expose(tensors);
  auto host = to_host(tensors);
  if (!checkAgreement_ || tensors.size() != 1) {
    // Gloo sends straight from the buffer: keep the aliases alive until done.
    return launch(std::move(access), OpType::SEND, kUnsetTimeout, tensors, [&] { return gloo_->send(host, dstRank, tag); },
                  [host]() {});
  }
  std::vector<at::Tensor> header{p2p_header(tensors[0], rank_)};
  auto headerWork = gloo_->send(header, dstRank, p2p_header_tag(tag));
  const auto timeout = effectiveTimeout(kUnsetTimeout);
  // The header left before the message (same pair, FIFO): its work is done
  // by the time the message's is, and this is its only waiter.
  return launch(std::move(access), OpType::SEND, kUnsetTimeout, tensors, [&] { return gloo_->send(host, dstRank, tag); },
                [host, header, headerWork, timeout]() { headerWork->wait(timeout); });
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::recvChecked(std::vector<at::Tensor>& tensors, int srcRank, int tag,
                                                         OpType type) {
  auto access = expose(tensors);
  auto host = to_host(tensors);
  std::vector<at::Tensor> header{at::empty({kP2PHeaderWords}, at::kLong)};
  const at::Tensor expected = p2p_header(tensors[0], rank_);
  const int headerTag = p2p_header_tag(tag);
  const auto timeout = effectiveTimeout(kUnsetTimeout);
  // From any source, the header is received from the message's sender once
  // the message is in (the sender sent it first, so it is waiting).
  auto headerWork = std::make_shared<c10::intrusive_ptr<Work>>();
  auto message = std::make_shared<c10::intrusive_ptr<Work>>();
  if (srcRank >= 0) *headerWork = gloo_->recv(header, srcRank, headerTag);
  auto gloo = gloo_;
  auto after = [gloo, host, header, headerWork, message, expected, headerTag, tag, timeout, rank = rank_]() mutable {
    if (!*headerWork) *headerWork = gloo->recv(header, (*message)->sourceRank(), headerTag);
    (*headerWork)->wait(timeout);
    const int64_t* got = header[0].data_ptr<int64_t>();
    const int64_t* want = expected.data_ptr<int64_t>();
    TORCH_CHECK(got[0] == kP2PMagic, "p2p argument check: rank ", rank, " read a malformed header (a peer with ",
                "TORCH_NEURONX_COLLECTIVE_CHECK=0, or the tag in use outside the neuron backend?)");
    if (got[2] != want[2] || got[3] != want[3]) {
      C10_THROW_ERROR(DistBackendError,
                      c10::str("p2p mismatch: rank ", got[1], " sent ", p2p_describe(got), " but rank ", rank,
                               " receives into ", p2p_describe(want), " (tag ", tag, ")"));
    }
  };
  return launch(std::move(access), type, kUnsetTimeout, tensors,
                [&] {
                  *message = srcRank < 0 ? gloo_->recvAnysource(host, tag) : gloo_->recv(host, srcRank, tag);
                  return *message;
                },
                std::move(after));
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  if (checkAgreement_ && tensors.size() == 1) return recvChecked(tensors, srcRank, tag, OpType::RECV);
  auto access = expose(tensors);
  auto host = to_host(tensors);
  return launch(std::move(access), OpType::RECV, kUnsetTimeout, tensors, [&] { return gloo_->recv(host, srcRank, tag); },
                [host]() {});
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  // The header names the sender; sourceRank() reads it from the header's work.
  if (checkAgreement_ && tensors.size() == 1) return recvChecked(tensors, -1, tag, OpType::RECVANYSOURCE);
  auto access = expose(tensors);
  auto host = to_host(tensors);
  return launch(std::move(access), OpType::RECVANYSOURCE, kUnsetTimeout, tensors, [&] { return gloo_->recvAnysource(host, tag); },
                [host]() {});
}

c10::intrusive_ptr<Work> ProcessGroupNeuron::barrier(const BarrierOptions& opts) {
  // opts.device (from device_ids or the bound device) names the device whose
  // queued work must finish first.
  if (opts.device && opts.device->is_privateuseone()) {
    at::neuron::rt_call([&] { neuronrt::current_stream(opts.device->index()).synchronize(); });
  }
  return launch(nullptr, OpType::BARRIER, opts.timeout, {}, [&] { return gloo_->barrier(opts); });
}

}  // namespace c10d
