// The direct kernels (DirectKernels.cpp): frequent small ops, unboxed and
// without host aliases. The route table (Routes.cpp) registers them; each
// takes the host path itself where the direct path does not apply.
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>

#include <optional>

namespace at::neuron::direct {

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha);
at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha);
at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha);
at::Tensor& sub_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha);
at::Tensor mul(const at::Tensor& self, const at::Tensor& other);
at::Tensor& mul_(at::Tensor& self, const at::Tensor& other);
at::Tensor div(const at::Tensor& self, const at::Tensor& other);
at::Tensor& div_(at::Tensor& self, const at::Tensor& other);
at::Tensor sum_dim(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                   std::optional<at::ScalarType> dtype);
at::Tensor& fill_(at::Tensor& self, const at::Scalar& value);
at::Tensor& zero_(at::Tensor& self);
at::Tensor index(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices);

// Points the DispatchStubs the kernels call at their CPU kernels for
// PrivateUse1 (idempotent).
void install_cpu_stubs();

}  // namespace at::neuron::direct
