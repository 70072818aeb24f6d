"""Recurrent layers on the device vs CPU: nn.LSTM / nn.GRU / nn.RNN (tanh and
relu) and their cells, forward outputs and final states, then backward
gradients of the input, the initial state and every parameter. The device
module is a copy of the CPU module, so both start from the same weights.

Runs under PyTorch's device-generic framework; see _dg_common.py."""
import copy

import torch
from torch import nn
from torch.testing._internal.common_utils import parametrize, run_tests

from _dg_common import DeviceTestCase, instantiate

TOL = dict(rtol=1e-4, atol=1e-5)

MODES = {
    "LSTM": lambda **kw: nn.LSTM(**kw),
    "GRU": lambda **kw: nn.GRU(**kw),
    "RNN_TANH": lambda **kw: nn.RNN(nonlinearity="tanh", **kw),
    "RNN_RELU": lambda **kw: nn.RNN(nonlinearity="relu", **kw),
}
CONFIGS = {
    "single": dict(num_layers=1, bidirectional=False, batch_first=False),
    "deep_bidir_batch_first": dict(num_layers=2, bidirectional=True, batch_first=True),
}


class TestRNN(DeviceTestCase):
    def _compare_grads(self, dev_mod, cpu_mod, device):
        for (name, p_dev), (_, p_cpu) in zip(dev_mod.named_parameters(), cpu_mod.named_parameters()):
            with self.subTest(param=name):
                self.assertIsNotNone(p_dev.grad)
                self.assertMatchesCPU(p_dev.grad, p_cpu.grad, device, **TOL)

    @parametrize("mode", list(MODES))
    @parametrize("config", list(CONFIGS))
    def test_forward_backward(self, device, mode, config):
        torch.manual_seed(0)
        cfg = CONFIGS[config]
        cpu_mod = MODES[mode](input_size=5, hidden_size=6, **cfg)
        dev_mod = copy.deepcopy(cpu_mod).to(device)
        seq, batch = 7, 3
        x = torch.randn((batch, seq, 5) if cfg["batch_first"] else (seq, batch, 5), requires_grad=True)
        states = cfg["num_layers"] * (2 if cfg["bidirectional"] else 1)
        h0 = torch.randn(states, batch, 6, requires_grad=True)
        hx = (h0, torch.randn(states, batch, 6, requires_grad=True)) if mode == "LSTM" else h0
        dx = x.detach().to(device).requires_grad_()
        dhx = tuple(h.detach().to(device).requires_grad_() for h in hx) if mode == "LSTM" \
            else h0.detach().to(device).requires_grad_()

        out_cpu, hn_cpu = cpu_mod(x, hx)
        out_dev, hn_dev = dev_mod(dx, dhx)
        self.assertMatchesCPU(out_dev, out_cpu, device, **TOL)
        self.assertMatchesCPU(hn_dev, hn_cpu, device, **TOL)

        def loss(out, hn):
            hs = hn if isinstance(hn, tuple) else (hn,)
            return (out * out).sum() + sum((h * 1.5).sum() for h in hs)

        loss(out_cpu, hn_cpu).backward()
        loss(out_dev, hn_dev).backward()
        self.assertMatchesCPU(dx.grad, x.grad, device, **TOL)
        for d, c in zip(dhx if mode == "LSTM" else (dhx,), hx if mode == "LSTM" else (hx,)):
            self.assertMatchesCPU(d.grad, c.grad, device, **TOL)
        self._compare_grads(dev_mod, cpu_mod, device)

    @parametrize("mode", list(MODES))
    def test_no_initial_state_eval(self, device, mode):
        torch.manual_seed(1)
        cpu_mod = MODES[mode](input_size=4, hidden_size=3, num_layers=2, dropout=0.5).eval()
        dev_mod = copy.deepcopy(cpu_mod).to(device)
        x = torch.randn(5, 2, 4)
        with torch.no_grad():
            self.assertMatchesCPU(dev_mod(x.to(device)), cpu_mod(x), device, **TOL)

    def test_lstm_proj_size(self, device):
        torch.manual_seed(2)
        cpu_mod = nn.LSTM(4, 6, proj_size=3)
        dev_mod = copy.deepcopy(cpu_mod).to(device)
        x = torch.randn(5, 2, 4)
        out_cpu, (h, c) = cpu_mod(x)
        out_dev, (hd, cd) = dev_mod(x.to(device))
        self.assertMatchesCPU((out_dev, hd, cd), (out_cpu, h, c), device, **TOL)
        out_cpu.sum().backward()
        out_dev.sum().backward()
        self._compare_grads(dev_mod, cpu_mod, device)

    def test_packed_sequence(self, device):
        torch.manual_seed(3)
        cpu_mod = nn.LSTM(4, 3, batch_first=True)
        dev_mod = copy.deepcopy(cpu_mod).to(device)
        x = torch.randn(3, 6, 4)
        lengths = torch.tensor([6, 4, 2])          # lengths stay on CPU (PyTorch's rule)
        pack = nn.utils.rnn.pack_padded_sequence
        out_cpu, _ = cpu_mod(pack(x, lengths, batch_first=True))
        out_dev, _ = dev_mod(pack(x.to(device), lengths, batch_first=True))
        pad = nn.utils.rnn.pad_packed_sequence
        self.assertMatchesCPU(pad(out_dev, batch_first=True)[0], pad(out_cpu, batch_first=True)[0],
                              device, **TOL)

    @parametrize("cell", ["LSTMCell", "GRUCell", "RNNCell"])
    def test_cell(self, device, cell):
        torch.manual_seed(4)
        cpu_mod = getattr(nn, cell)(4, 5)
        dev_mod = copy.deepcopy(cpu_mod).to(device)
        x = torch.randn(3, 4)
        h = torch.randn(3, 5)
        hx = (h, torch.randn(3, 5)) if cell == "LSTMCell" else h
        dhx = tuple(t.to(device) for t in hx) if cell == "LSTMCell" else h.to(device)
        out_cpu, out_dev = cpu_mod(x, hx), dev_mod(x.to(device), dhx)
        self.assertMatchesCPU(out_dev, out_cpu, device, **TOL)
        first = (lambda o: o[0]) if cell == "LSTMCell" else (lambda o: o)
        first(out_cpu).pow(2).sum().backward()
        first(out_dev).pow(2).sum().backward()
        self._compare_grads(dev_mod, cpu_mod, device)


instantiate(TestRNN, globals())

if __name__ == "__main__":
    run_tests()
