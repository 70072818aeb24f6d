#include "csrc/distributed/Dtypes.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "csrc/aten/HostExecution.h"

namespace c10d::neuron_pg {

// Element types Gloo's kernels are instantiated for.
static bool gloo_has_dtype(at::ScalarType t) {
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
  return map_each(ts, [](const at::Tensor& t) { return host_view(t); });
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
  return map_each(ts, [](const at::Tensor& t) { return to_host(t); });
}

std::vector<std::vector<at::Tensor>> to_host(const std::vector<std::vector<at::Tensor>>& lists) {
  return map_each(lists, [](const std::vector<at::Tensor>& l) { return to_host(l); });
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

// PREMUL_SUM's factor as a scalar (the supplement holds a double or a
// one-element tensor, possibly on neuron).
static at::Scalar premul_factor(const ReduceOp& op) {
  auto sup = c10::dynamic_intrusive_pointer_cast<PreMulSumSupplement>(op.supplement_);
  TORCH_CHECK(sup, "ReduceOp.PREMUL_SUM has no factor: create it with torch.distributed._make_nccl_premul_sum");
  if (sup->tensor_factor.defined()) return host_view(sup->tensor_factor).reshape({}).item();
  return sup->double_factor;
}

// Gloo reduces int16/uint16/uint32 nowhere; a wider integer gives the same
// bits (sum, product, min, max and bitwise ops all commute with truncation
// modulo 2^16 / 2^32 in two's complement).
static std::optional<at::ScalarType> widened(at::ScalarType t) {
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
  return map_each(hs, [&](const at::Tensor& h) { return reduction_input(h, op); });
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

// The device the work's future reports: the neuron device of the outputs
// (or inputs), none for CPU-only collectives.
std::vector<c10::Device> devices_of(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
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

// PREMUL_SUM reaches the engine as SUM over the scaled scratch (gloo_opts).
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
// for floating types, which check_reduction_arg already enforced).
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

// A contiguous flat byte view of host tensor `h` (a copy if not contiguous).
static at::Tensor flat_bytes(const at::Tensor& h) {
  return h.contiguous().reshape({-1}).view(at::kByte);
}

at::Tensor cat_flat(const std::vector<at::Tensor>& ts) {
  if (ts.size() == 1) return host_view(ts[0]).reshape({-1});  // a view where it can
  return at::cat(map_each(ts, [](const at::Tensor& t) { return host_view(t).reshape({-1}); }));
}

int64_t largest_bytes(const std::vector<at::Tensor>& outs) {
  int64_t block = 0;
  for (const auto& o : outs) block = std::max<int64_t>(block, o.numel() * static_cast<int64_t>(o.element_size()));
  return block;
}

at::Tensor padded_bytes(const at::Tensor& input, int64_t block) {
  at::Tensor p = at::zeros({block}, at::kByte);
  at::Tensor b = flat_bytes(host_view(input));
  p.narrow(0, 0, b.numel()).copy_(b);
  return p;
}

void copy_blocks(const std::vector<at::Tensor>& hostOuts, const at::Tensor& gathered, int64_t block) {
  for (size_t r = 0; r < hostOuts.size(); ++r) {
    at::Tensor o = hostOuts[r];
    if (!o.defined() || o.numel() == 0) continue;
    const int64_t bytes = o.numel() * static_cast<int64_t>(o.element_size());
    o.copy_(gathered.narrow(0, static_cast<int64_t>(r) * block, bytes).view(o.scalar_type()).view(o.sizes()));
  }
}

}  // namespace c10d::neuron_pg
