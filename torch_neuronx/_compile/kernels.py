"""Asynchronous launch of Inductor's C++ kernels in neuron graphs: Inductor's
kernel binding with a call step that queues the kernel on the current stream
of its tensors' device (docs/compile.md, "What the lowering does")."""
from __future__ import annotations

import textwrap

from torch._inductor.async_compile import AsyncCompile
from torch._inductor.codecache import CppPythonBindingsCodeCache
from torch._inductor.utils import clear_on_fresh_cache
from torch.utils._ordered_set import OrderedSet

_ARG_CHECK = "if(PyTuple_GET_SIZE(args) != {arg_len})"
_ARG_CHECK_WITH_NAME = "if(PyTuple_GET_SIZE(args) != {arg_len} && PyTuple_GET_SIZE(args) != {arg_len} + 1)"
if _ARG_CHECK not in CppPythonBindingsCodeCache.suffix_template:
    raise ImportError("torch_neuronx: Inductor's kernel binding has no argument-count check to extend")


@clear_on_fresh_cache
class NeuronKernelBindings(CppPythonBindingsCodeCache):
    cache: dict = {}
    _loaded_module_names: OrderedSet[str] = OrderedSet()

    @staticmethod
    def cache_clear() -> None:
        NeuronKernelBindings.cache.clear()

    # Inductor's binding, which also takes the kernel's name as a last argument.
    suffix_template = CppPythonBindingsCodeCache.suffix_template.replace(_ARG_CHECK, _ARG_CHECK_WITH_NAME)

    extra_parse_arg = textwrap.dedent("""
        #include <tuple>
        #include <type_traits>

        // launch_compiled_kernel (csrc/python/CompiledKernels.cpp), from torch_neuronx._C.
        using NeuronLaunch = int (*)(PyObject* args, const char* name, void (*run)(void*), void (*drop)(void*),
                                     void* closure);
        static NeuronLaunch neuron_launcher() {{
            static const NeuronLaunch launch = [] {{
                PyObject* module = PyImport_ImportModule("torch_neuronx._C");
                PyObject* address = module ? PyObject_CallMethod(module, "_compiled_kernel_launcher", nullptr) : nullptr;
                void* p = address ? PyLong_AsVoidPtr(address) : nullptr;
                Py_XDECREF(address);
                Py_XDECREF(module);
                if (!p || PyErr_Occurred())
                    throw std::runtime_error("neuron kernel binding: no launcher in torch_neuronx._C");
                return reinterpret_cast<NeuronLaunch>(p);
            }}();
            return launch;
        }}""")

    # `{}` is the parsed arguments, in the kernel's order; the name follows them.
    call_entry_function = textwrap.dedent("""
        auto parsed = std::make_tuple({});
        constexpr Py_ssize_t n_args = std::tuple_size_v<decltype(parsed)>;
        const char* name = PyTuple_GET_SIZE(args) > n_args ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(args, n_args))
                                                           : "cpp_kernel";
        if (!name) return nullptr;
        auto* closure = new auto([a = std::move(parsed)]() {{ std::apply(kernel, a); }});
        using Closure = std::remove_pointer_t<decltype(closure)>;
        if (neuron_launcher()(args, name, [](void* c) {{ (*static_cast<Closure*>(c))(); }},
                              [](void* c) {{ delete static_cast<Closure*>(c); }}, closure) != 0)
            return nullptr;
        Py_RETURN_NONE;""")


class NeuronAsyncCompile(AsyncCompile):
    """``async_compile`` of neuron graphs' wrappers: C++ kernels get the
    binding above; everything else is Inductor's."""

    def cpp_pybinding(self, argtypes, source_code):
        from torch._inductor.async_compile import LambdaFuture, get_compile_threads

        if get_compile_threads() <= 1:
            return NeuronKernelBindings.load_pybinding(argtypes, source_code)
        return LambdaFuture(NeuronKernelBindings.load_pybinding_async(argtypes, source_code, submit_fn=self.submit))
