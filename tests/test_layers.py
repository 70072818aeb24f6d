"""The layers above csrc/runtime reach it through Runtime.h only
(docs/runtime.md): the allocator, protect mode and the registry are the host
runtime's own, so a hardware runtime can replace them behind the header."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^\s*#\s*include\s+"csrc/runtime/([^"]+)"', re.M)


def test_upper_layers_include_only_runtime_h():
    offenders = []
    for layer in ("aten", "python", "distributed"):
        for path in sorted((ROOT / "csrc" / layer).rglob("*")):
            if path.suffix in (".h", ".cpp", ".inc"):
                offenders += [f"{path.relative_to(ROOT)}: {h}" for h in INCLUDE.findall(path.read_text())
                              if h != "Runtime.h"]
    assert not offenders, "\n".join(offenders)


def test_runtime_h_does_not_expose_host_runtime_internals():
    text = (ROOT / "csrc/runtime/Runtime.h").read_text()
    for internal in ("CachingAllocator.h", "Protect.h", "Registry.h"):
        assert f'"{internal}"' not in text, internal
