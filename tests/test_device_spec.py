"""The device spec file loads through Transformers' own test utilities."""
import os
import pathlib
import subprocess
import sys

SPEC = pathlib.Path(__file__).resolve().parents[1] / "tools" / "device_spec" / "neuron_spec.py"


def test_transformers_testing_utils_pick_up_the_spec():
    code = (
        "import torch\n"
        "from transformers import testing_utils as tu\n"
        "assert tu.torch_device == 'neuron', tu.torch_device\n"
        "tu.backend_manual_seed('neuron', 3); a = torch.rand(4, device='neuron')\n"
        "tu.backend_manual_seed('neuron', 3); b = torch.rand(4, device='neuron')\n"
        "assert torch.equal(a.cpu(), b.cpu())\n"
        "assert tu.backend_device_count('neuron') == torch.neuron.device_count() == 2\n"
        "tu.backend_empty_cache('neuron')\n"
        "print('ok')\n"
    )
    # Transformers imports the spec by the file name it is given, relative to the working directory.
    env = {**os.environ, "TRANSFORMERS_TEST_DEVICE": "neuron", "TRANSFORMERS_TEST_DEVICE_SPEC": SPEC.name}
    env.pop("NEURON_RT_NUM_CORES", None)
    env.pop("NEURON_RT_VISIBLE_CORES", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         cwd=SPEC.parent)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
