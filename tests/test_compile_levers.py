"""The compile levers (torch_neuronx/_compile): listed completely, pulled only
while torch needs them, and invisible to graphs of other devices."""
import os

import pytest
import torch

from conftest import run_json

import torch_neuronx._compile as compile_pkg


def test_cpu_graph_after_neuron_graph_is_stock():
    """A CPU graph compiled in the same process after a neuron graph sees
    Inductor's config and lowerings as without torch_neuronx: a cat lowering
    another package registered first still runs for CPU inputs, Inductor's
    own cat lowering is untouched, and loop reindexing is off only while
    the neuron graph is scheduled. (Caches off: a cached graph is not lowered.)"""
    out = run_json("""
        import json
        import torch
        from torch._inductor import config, lowering
        from torch._inductor.scheduler import Scheduler

        aten = torch.ops.aten
        stock_cat = lowering.lowerings[aten.cat.default]
        stock_config = config.get_config_copy()
        foreign_calls = []

        def foreign_cat(inputs, dim=0):  # "another package's" lowering: it looks, then declines
            foreign_calls.append(inputs[0].get_device().type)
            return None

        lowering.user_lowerings[aten.cat.default] = foreign_cat

        scheduled = []
        fuse_nodes = Scheduler.fuse_nodes

        def recording_fuse_nodes(self, nodes):
            devices = sorted({n.get_device().type for n in nodes if n.get_device() is not None})
            scheduled.append((devices, config.loop_reindexing_after_fusion))
            return fuse_nodes(self, nodes)

        Scheduler.fuse_nodes = recording_fuse_nodes

        def f(x, y):
            z = torch.cat([x.sin(), y * 2])
            return z - z.mean(-1, keepdim=True)

        x, y = torch.randn(4, 8), torch.randn(3, 8)
        ref = f(x, y)
        neuron_out = torch.compile(f)(x.to("neuron"), y.to("neuron")).cpu()
        after_neuron = list(foreign_calls)
        torch._dynamo.reset()
        cpu_out = torch.compile(f)(x, y)
        changed = sorted(k for k, v in config.get_config_copy().items() if stock_config.get(k) != v)
        print(json.dumps({
            "neuron_err": (neuron_out - ref).abs().max().item(), "cpu_err": (cpu_out - ref).abs().max().item(),
            "foreign_after_neuron": after_neuron, "foreign_all": foreign_calls,
            "cat_stock": lowering.lowerings[aten.cat.default] is stock_cat,
            "chained_previous_is_foreign": lowering.user_lowerings[aten.cat.default].previous is foreign_cat,
            "scheduled": scheduled, "config_changed": changed,
        }))
        """, env={"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"})
    assert out["neuron_err"] < 1e-5 and out["cpu_err"] < 1e-5, out
    # Neuron cats are neuron's (ConcatKernel); the CPU cat reached the foreign lowering.
    assert out["foreign_after_neuron"] == [], out
    assert out["foreign_all"] == ["cpu"], out
    assert out["cat_stock"] and out["chained_previous_is_foreign"], out
    assert [devices for devices, _ in out["scheduled"]] == [["neuron"], ["cpu"]], out
    assert [flag for _, flag in out["scheduled"]] == [False, True], out
    assert out["config_changed"] == [], out


def test_lever_list_is_complete():
    """Every module of the compile package is named by a lever, and every
    lever names code that exists, why it is pulled and how it retires."""
    package_dir = os.path.dirname(compile_pkg.__file__)
    modules = {f[:-3] for f in os.listdir(package_dir) if f.endswith(".py") and f != "__init__.py"}
    text = " ".join(f"{lv.pull_fn} {lv.probe} {lv.torch_api} {lv.phase}" for lv in compile_pkg.LEVERS)
    unnamed = {m for m in modules if f"{m}:" not in text and f"{m}." not in text and f"{m}.py" not in text}
    assert not unnamed, f"modules of torch_neuronx/_compile no lever names: {unnamed}"
    names = [lv.name for lv in compile_pkg.LEVERS]
    assert len(names) == len(set(names))
    for lever in compile_pkg.LEVERS:
        # Pulled by install(), or the phase says what pulls it.
        assert lever.phase in compile_pkg.PHASES or lever.phase.startswith("by "), lever
        assert lever.torch_api and lever.why, lever
        assert lever.retired, f"{lever.name}: no probe and no retirement condition"
        for ref in (lever.pull_fn, lever.probe):
            assert not ref or callable(compile_pkg.resolve(ref)), ref


def test_install_rejects_an_unknown_phase():
    with pytest.raises(ValueError, match="unknown phase 'compile'"):
        compile_pkg.install("compile")


def test_a_retired_lever_is_not_pulled():
    """The probe decides: once torch has what a lever adds, pulling it is a no-op."""
    torch.compile(lambda x: x + 1)(torch.ones(2, device="neuron"))  # Inductor levers installed
    lever = next(lv for lv in compile_pkg.LEVERS if lv.name == "ATen device name")
    assert not lever.needed()  # installed: torch's table now has neuron
    assert lever.pull() is False
    from torch._inductor.codegen import cpp_utils

    assert cpp_utils.DEVICE_TO_ATEN["neuron"] == "at::kPrivateUse1"


def test_chained_lowering_delegates_and_is_idempotent():
    from torch._inductor.lowering import user_lowerings

    from torch_neuronx._compile.lowering import chain

    op = torch.ops.aten.special_erfcx.default  # no user lowering in torch or torch_neuronx
    calls = []

    def previous(x):
        calls.append(("previous", x))
        return "previous-result"

    def ours(x):
        calls.append(("ours", x))
        return "ours-result" if x == "neuron" else None

    assert op not in user_lowerings
    user_lowerings[op] = previous
    try:
        chain(op, ours)
        chained = user_lowerings[op]
        chain(op, ours)  # a second install does not wrap twice
        assert user_lowerings[op] is chained and chained.previous is previous
        assert chained("neuron") == "ours-result"
        assert chained("cpu") == "previous-result"
        assert calls == [("ours", "neuron"), ("ours", "cpu"), ("previous", "cpu")]
    finally:
        del user_lowerings[op]


def test_dynamo_backend_is_registered_once_by_its_entry_point():
    """Importing the compile package registers no backend; Dynamo's lookup
    registers the entry point's function."""
    out = run_json("""
        import json
        import torch
        import torch_neuronx._compile.dynamo as dynamo
        from torch._dynamo.backends import registry

        before = "neuron" in registry._COMPILER_FNS
        backend = registry.lookup_backend("neuron")
        print(json.dumps({"before": before, "same": backend is dynamo.neuron_backend,
                          "listed": "neuron" in registry.list_backends()}))
        """)
    assert out == {"before": False, "same": True, "listed": True}
