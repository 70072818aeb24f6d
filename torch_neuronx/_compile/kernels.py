"""Asynchronous launch of Inductor's C++ kernels in neuron graphs.

Inductor calls each C++ kernel of a graph's Python wrapper through a small
Python binding compiled with the kernel (``CppPythonBindingsCodeCache``): it
parses the arguments and calls the kernel on the spot. Neuron graphs get a
binding of their own, built through the same code cache and compiler: it
parses the arguments on the caller (raw pointers of the tensors, sizes) into
a closure and queues that on the current stream of the tensors' device
(``launch_compiled_kernel`` in csrc/python/CompiledKernels.cpp), so the
wrapper runs ahead while the kernels execute, as an eager program does.
The kernel holds its tensors' storages until it has run.

The wrapper passes the kernel's name as one more argument, for the profiler.
A kernel without neuron tensors (a host kernel of a mixed graph) runs at once.
The binding finds the launcher by asking ``torch_neuronx._C`` for its address
when it loads; Inductor's own tensor-pointer helper comes, as for Inductor's
bindings, from the variable Inductor sets before loading one.
"""
from __future__ import annotations

import textwrap

from torch._inductor.async_compile import AsyncCompile
from torch._inductor.codecache import CppPythonBindingsCodeCache
from torch._inductor.utils import clear_on_fresh_cache
from torch.utils._ordered_set import OrderedSet

@clear_on_fresh_cache
class NeuronKernelBindings(CppPythonBindingsCodeCache):
    cache: dict = {}
    _loaded_module_names: OrderedSet[str] = OrderedSet()

    @staticmethod
    def cache_clear() -> None:
        NeuronKernelBindings.cache.clear()

    # `{}` is the parsed arguments, in the kernel's order.
    call_entry_function = textwrap.dedent("""
        auto* closure = new auto([a = std::make_tuple({})]() {{ std::apply(kernel, a); }});
        using Closure = std::remove_pointer_t<decltype(closure)>;
        if (_neuron_launch(args, name, [](void* c) {{ (*static_cast<Closure*>(c))(); }},
                           [](void* c) {{ delete static_cast<Closure*>(c); }}, closure) != 0)
            return nullptr;
        Py_RETURN_NONE;""")

    suffix_template = textwrap.dedent("""
        // Python binding that queues {entry_func}() on the current neuron stream:
        #define PY_SSIZE_T_CLEAN
        #include <Python.h>
        #include <cerrno>
        #include <cstdlib>
        #include <stdexcept>
        #include <tuple>
        #include <type_traits>

        static void* (*_torchinductor_pyobject_tensor_data_ptr)(PyObject* obj);
        static int (*_neuron_launch)(PyObject* args, const char* name, void (*run)(void*), void (*drop)(void*),
                                     void* closure);

        template <typename T> static inline T parse_arg(PyObject* args, size_t n) {{
            static_assert(std::is_pointer_v<T>, "arg type must be pointer or long");
            return static_cast<T>(_torchinductor_pyobject_tensor_data_ptr(PyTuple_GET_ITEM(args, n)));
        }}
        template <> inline int64_t parse_arg<int64_t>(PyObject* args, size_t n) {{
            auto result = PyLong_AsSsize_t(PyTuple_GET_ITEM(args, n));
            if (result == -1 && PyErr_Occurred()) [[unlikely]]
                throw std::runtime_error("expected int arg");
            return result;
        }}
        template <> inline uintptr_t parse_arg<uintptr_t>(PyObject* args, size_t n) {{
            auto result = PyLong_AsVoidPtr(PyTuple_GET_ITEM(args, n));
            if (result == reinterpret_cast<void*>(-1) && PyErr_Occurred()) [[unlikely]]
                throw std::runtime_error("expected int arg");
            return reinterpret_cast<uintptr_t>(result);
        }}
        template <> inline float parse_arg<float>(PyObject* args, size_t n) {{
            auto result = PyFloat_AsDouble(PyTuple_GET_ITEM(args, n));
            if (result == -1.0 && PyErr_Occurred()) [[unlikely]]
                throw std::runtime_error("expected float arg");
            return static_cast<float>(result);
        }}

        {extra_parse_arg}

        static PyObject* {entry_func}_py(PyObject* self, PyObject* args) {{
            try {{
                if (!PyTuple_CheckExact(args)) [[unlikely]]
                    throw std::runtime_error("tuple args required");
                const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
                if (nargs != {arg_len} && nargs != {arg_len} + 1) [[unlikely]]
                    throw std::runtime_error("requires {arg_len} args and optionally the kernel's name");
                const char* name = "cpp_kernel";
                if (nargs > {arg_len}) {{
                    name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(args, {arg_len}));
                    if (!name) return nullptr;
                }}
                {call_entry_func}
            }} catch (std::exception const& e) {{
                PyErr_SetString(PyExc_RuntimeError, e.what());
                return nullptr;
            }} catch (...) {{
                PyErr_SetString(PyExc_RuntimeError, "unhandled error");
                return nullptr;
            }}
        }}

        static PyMethodDef py_methods[] = {{
            {{"{entry_func}", {entry_func}_py, METH_VARARGS, ""}},
            {{NULL, NULL, 0, NULL}}}};

        static struct PyModuleDef py_module =
            {{PyModuleDef_HEAD_INIT, "{entry_func}", NULL, -1, py_methods}};

        static bool _read_address(const char* var, uintptr_t* out) {{
            const char* s = std::getenv(var);
            if (!s) return false;
            char* end = nullptr;
            errno = 0;
            *out = std::strtoull(s, &end, 10);
            return errno == 0 && end != s && *out != 0;
        }}

        // launch_compiled_kernel's address, from torch_neuronx._C (csrc/python/CompiledKernels.cpp).
        static bool _launcher_address(uintptr_t* out) {{
            PyObject* module = PyImport_ImportModule("torch_neuronx._C");
            if (!module) return false;
            PyObject* address = PyObject_CallMethod(module, "_compiled_kernel_launcher", nullptr);
            Py_DECREF(module);
            if (!address) return false;
            *out = reinterpret_cast<uintptr_t>(PyLong_AsVoidPtr(address));
            Py_DECREF(address);
            return !PyErr_Occurred() && *out != 0;
        }}

        PyMODINIT_FUNC PyInit_{entry_func}(void) {{
            uintptr_t data_ptr = 0, launch = 0;
            if (!_read_address("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", &data_ptr)) {{
                PyErr_SetString(PyExc_RuntimeError, "neuron kernel binding: Inductor's tensor-pointer helper is not set");
                return nullptr;
            }}
            if (!_launcher_address(&launch)) {{
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_RuntimeError, "neuron kernel binding: no launcher in torch_neuronx._C");
                return nullptr;
            }}
            _torchinductor_pyobject_tensor_data_ptr = reinterpret_cast<decltype(_torchinductor_pyobject_tensor_data_ptr)>(data_ptr);
            _neuron_launch = reinterpret_cast<decltype(_neuron_launch)>(launch);
            return PyModule_Create(&py_module);
        }}
        """)


class NeuronAsyncCompile(AsyncCompile):
    """``async_compile`` of neuron graphs' wrappers: C++ kernels get the
    binding above; everything else is Inductor's."""

    def cpp_pybinding(self, argtypes, source_code):
        from torch._inductor.async_compile import LambdaFuture, get_compile_threads

        if get_compile_threads() <= 1:
            return NeuronKernelBindings.load_pybinding(argtypes, source_code)
        return LambdaFuture(NeuronKernelBindings.load_pybinding_async(argtypes, source_code, submit_fn=self.submit))
