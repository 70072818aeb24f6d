#include "csrc/distributed/Agreement.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <mutex>

#include "csrc/distributed/Completion.h"
#include "csrc/distributed/Dtypes.h"
#include "csrc/distributed/ProcessGroupNeuron.h"
#include "csrc/distributed/ShmPath.h"

namespace c10d {
namespace neuron_pg {

namespace {
// Marks a rank's words as "rejected its arguments" (word 1, where the dtype
// goes otherwise; word 2 holds the ArgProblem).
constexpr int64_t kRejected = -2;
}  // namespace


std::vector<int64_t> agreement_words(OpType type, int size_, const std::vector<at::Tensor>& tensors,
                                     const std::vector<int64_t>& inSplits, const std::vector<int64_t>& outSplits,
                                     int64_t redop) {
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

std::vector<int64_t> rejection_words(OpType type, int size, ArgProblem problem) {
  std::vector<int64_t> words = agreement_words(type, size, {});
  words[1] = kRejected;
  words[2] = static_cast<int64_t>(problem);
  return words;
}

std::string disagreement(int size_, const std::vector<int64_t>& mine, const int64_t* all) {
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
      ranks += c10::str(" send splits [", c10::Join(", ", c10::ArrayRef<int64_t>(q + 4, size_)), "] receive splits [",
                        c10::Join(", ", c10::ArrayRef<int64_t>(q + 4 + size_, size_)), "] (elements)");
    } else {
      ranks += c10::str(", ", q[2], " elements");
    }
  }
  return c10::str("the ranks called mismatched collectives (op, dtype or sizes differ):", ranks);
}

}  // namespace neuron_pg

using namespace neuron_pg;
using neuron_pg::classify;  // not c10d::classify

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
  try {
    agree(type, opTimeout, rejection_words(type, size_, problem));
  } catch (...) {  // this rank's own error says more than a failed announcement
  }
  std::rethrow_exception(error);
}

void ProcessGroupNeuron::agree(OpType type, std::chrono::milliseconds opTimeout, const std::vector<int64_t>& p) {
  if (!checkAgreement_ || size_ == 1) return;
  checkUsable();
  const int64_t width = static_cast<int64_t>(p.size());
  const auto timeout = effectiveTimeout(opTimeout);
  const std::string what = describeOp(type, seq_.load() + 1, opTimeout);
  std::string mismatch;
  if (shm_ && p.size() <= neuronrt::ShmCollectives::kExchangeWords) {
    // Through shared memory: no Gloo round trip. This is also the step a
    // rank meets when its peers' collective runs on the shared-memory path.
    neuronrt::ShmCheck check{p.data(), p.size(), [&](const int64_t* all) { mismatch = disagreement(size_, p, all); }};
    try {
      shm_->exchange(check, timeout);
    } catch (const neuronrt::ShmError& e) {
      if (e.kind == neuronrt::ShmError::Kind::Timeout) handleTimeout(what);
      if (!aborted_.load()) note_error(*error_, classify(e.what()));
      C10_THROW_ERROR(DistBackendError, c10::str(what, " failed: ", e.what()));
    }
  } else {
    at::Tensor mine = at::tensor(p, at::kLong);
    at::Tensor rows = at::empty({size_ * width}, at::kLong);  // rank r's words at r * width
    AllgatherOptions ao;
    ao.timeout = timeout;
    try {
      auto fut = gloo_->_allgather_base(rows, mine, ao)->getFuture();
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
    mismatch = disagreement(size_, p, rows.data_ptr<int64_t>());
  }
  if (!mismatch.empty()) C10_THROW_ERROR(DistBackendError, c10::str(what, ": ", mismatch));
}

}  // namespace c10d
