// Fused LSTM and GRU cells. ATen's RNN code sends every accelerator
// (is_cuda() || is_xpu() || is_privateuseone()) to _thnn_fused_lstm_cell /
// _thnn_fused_gru_cell, which PyTorch implements only for CUDA, so nn.LSTM,
// nn.GRU and their *Cell modules need these on neuron. They are written as
// ATen ops on device tensors. The workspace is ours: the forward stores what
// our backward reads (activated gates and, for GRU, hx and the hidden n gate).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "OpTracking.h"

namespace at::neuron {
namespace {

at::Tensor with_biases(at::Tensor gates, const std::optional<at::Tensor>& input_bias,
                       const std::optional<at::Tensor>& hidden_bias) {
  if (input_bias && input_bias->defined()) gates = gates + *input_bias;
  if (hidden_bias && hidden_bias->defined()) gates = gates + *hidden_bias;
  return gates;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(const at::Tensor& input_gates,
                                                         const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                         const std::optional<at::Tensor>& input_bias,
                                                         const std::optional<at::Tensor>& hidden_bias) {
  TORCH_CHECK(input_gates.dim() == 2 && input_gates.sizes() == hidden_gates.sizes(),
              "_thnn_fused_lstm_cell: input_gates and hidden_gates must be 2-D of the same shape, got ",
              input_gates.sizes(), " and ", hidden_gates.sizes());
  auto chunks = with_biases(input_gates + hidden_gates, input_bias, hidden_bias).chunk(4, 1);
  at::Tensor ig = chunks[0].sigmoid();
  at::Tensor fg = chunks[1].sigmoid();
  at::Tensor cg = chunks[2].tanh();
  at::Tensor og = chunks[3].sigmoid();
  at::Tensor cy = fg * cx + ig * cg;
  at::Tensor hy = og * cy.tanh();
  return {hy, cy, at::cat({ig, fg, cg, og}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(const std::optional<at::Tensor>& grad_hy,
                                                                  const std::optional<at::Tensor>& grad_cy,
                                                                  const at::Tensor& cx, const at::Tensor& cy,
                                                                  const at::Tensor& workspace, bool has_bias) {
  const bool has_ghy = grad_hy && grad_hy->defined();
  const bool has_gcy = grad_cy && grad_cy->defined();
  if (!has_ghy && !has_gcy) return {};
  auto gates = workspace.chunk(4, 1);
  const at::Tensor &ig = gates[0], &fg = gates[1], &cg = gates[2], &og = gates[3];
  at::Tensor tanh_cy = cy.tanh();
  at::Tensor gcx = at::zeros_like(cx);
  at::Tensor gog = at::zeros_like(og);
  if (has_ghy) {
    gog = *grad_hy * tanh_cy * (1 - og) * og;
    gcx = *grad_hy * og * (1 - tanh_cy * tanh_cy);
  }
  if (has_gcy) gcx = gcx + *grad_cy;
  at::Tensor gig = gcx * cg * (1 - ig) * ig;
  at::Tensor gfg = gcx * cx * (1 - fg) * fg;
  at::Tensor gcg = gcx * ig * (1 - cg * cg);
  at::Tensor grad_gates = at::cat({gig, gfg, gcg, gog}, 1);
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, gcx * fg, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                            const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                            const std::optional<at::Tensor>& hidden_bias) {
  TORCH_CHECK(input_gates.dim() == 2 && input_gates.sizes() == hidden_gates.sizes(),
              "_thnn_fused_gru_cell: input_gates and hidden_gates must be 2-D of the same shape, got ",
              input_gates.sizes(), " and ", hidden_gates.sizes());
  // The n gate adds its input and hidden parts only after the reset gate
  // scales the hidden part, so the biases are applied per side.
  auto in = with_biases(input_gates, input_bias, std::nullopt).chunk(3, 1);
  auto hn = with_biases(hidden_gates, hidden_bias, std::nullopt).chunk(3, 1);
  at::Tensor rg = (in[0] + hn[0]).sigmoid();
  at::Tensor ig = (in[1] + hn[1]).sigmoid();
  at::Tensor ng = (in[2] + rg * hn[2]).tanh();
  at::Tensor hy = ng + ig * (hx - ng);
  return {hy, at::cat({rg, ig, ng, hx, hn[2]}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  auto ws = workspace.chunk(5, 1);
  const at::Tensor &rg = ws[0], &ig = ws[1], &ng = ws[2], &hx = ws[3], &hn = ws[4];
  at::Tensor gig = grad_hy * (hx - ng) * (1 - ig) * ig;
  at::Tensor ghx = grad_hy * ig;
  at::Tensor gin = grad_hy * (1 - ig) * (1 - ng * ng);
  at::Tensor ghn = gin * rg;
  at::Tensor grg = gin * hn * (1 - rg) * rg;
  at::Tensor grad_input_gates = at::cat({grg, gig, gin}, 1);
  at::Tensor grad_hidden_gates = at::cat({grg, gig, ghn}, 1);
  at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  return {grad_input_gates, grad_hidden_gates, ghx, grad_input_bias, grad_hidden_bias};
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", &Noted<at::_ops::_thnn_fused_lstm_cell, lstm_cell>::call);
  m.impl("_thnn_fused_lstm_cell_backward_impl",
         &Noted<at::_ops::_thnn_fused_lstm_cell_backward_impl, lstm_cell_backward>::call);
  m.impl("_thnn_fused_gru_cell", &Noted<at::_ops::_thnn_fused_gru_cell, gru_cell>::call);
  m.impl("_thnn_fused_gru_cell_backward", &Noted<at::_ops::_thnn_fused_gru_cell_backward, gru_cell_backward>::call);
}

}  // namespace
}  // namespace at::neuron
