"""nki.typing: shape annotations (``nt.tensor[128, 512]``). They document a
kernel's signature; tracing reads shapes from the arguments."""


class _Annotation:
    def __init__(self, kind, shape):
        self.kind, self.shape = kind, shape

    def __repr__(self):
        return f"nt.{self.kind}[{', '.join(map(str, self.shape))}]"


class _Factory:
    def __init__(self, kind):
        self.kind = kind

    def __getitem__(self, shape):
        return _Annotation(self.kind, shape if isinstance(shape, tuple) else (shape,))

    def __repr__(self):
        return f"nt.{self.kind}"


tensor = _Factory("tensor")
mutable_tensor = _Factory("mutable_tensor")
scalar = _Factory("scalar")

__all__ = ["tensor", "mutable_tensor", "scalar"]
