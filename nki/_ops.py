"""The elementwise function table: each ``nl.<op>`` is an ``ElementwiseOp``
that builds a tile when called in a kernel and names an ALU/activation
function when passed as ``op=`` to an nki.isa instruction."""
import torch
import torch.nn.functional as F


class ElementwiseOp:
    """``kind``: ``arith`` (fp32 math), ``cmp`` (fp32 in, 1.0/0.0 out),
    ``bitvec`` (integers only)."""

    def __init__(self, name, fn, arity, kind="arith", reduce=None):
        self.name, self.fn, self.arity, self.kind, self.reduce = name, fn, arity, kind, reduce
        self._nki_op = self
        self.__name__ = name
        self.__doc__ = f"nki.language.{name}: elementwise {'unary' if arity == 1 else 'binary'} op"

    def __repr__(self):
        return f"nl.{self.name}"

    def __call__(self, *args, dtype=None, **kwargs):
        from .language import _elementwise
        if len(args) != self.arity:
            raise TypeError(f"nl.{self.name} takes {self.arity} operand(s), got {len(args)}")
        return _elementwise(self, args, dtype)

    def compute(self, *xs):
        """Applies the op to fp32 (or int64 for bitvector ops) tensors/numbers."""
        xs = [x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.int64 if self.kind == "bitvec"
                                                                 else torch.float32) for x in xs]
        r = self.fn(*xs)
        if r.dtype == torch.bool:
            r = r.to(torch.float32)
        return r


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


_UNARY = {
    "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin,
    "cos": torch.cos, "tan": torch.tan, "arctan": torch.atan, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "relu": torch.relu, "gelu": F.gelu, "gelu_apprx_tanh": _gelu_tanh, "gelu_dx": None, "silu": F.silu,
    "softplus": F.softplus, "mish": F.mish, "erf": torch.erf, "abs": torch.abs, "square": torch.square,
    "negative": torch.neg, "reciprocal": torch.reciprocal, "sign": torch.sign, "ceil": torch.ceil,
    "floor": torch.floor, "trunc": torch.trunc, "copy": lambda x: x.clone(), "identity": lambda x: x.clone(),
    "logical_not": lambda x: x == 0,
}
_UNARY = {k: v for k, v in _UNARY.items() if v is not None}

_BINARY = {
    "add": (torch.add, "sum"), "subtract": (torch.sub, None), "multiply": (torch.mul, "prod"),
    "divide": (torch.div, None), "maximum": (torch.maximum, "amax"), "minimum": (torch.minimum, "amin"),
    "power": (torch.pow, None), "fmod": (torch.fmod, None),
    "equal": (torch.eq, None), "not_equal": (torch.ne, None), "greater": (torch.gt, None),
    "greater_equal": (torch.ge, None), "less": (torch.lt, None), "less_equal": (torch.le, None),
    "logical_and": (lambda a, b: (a != 0) & (b != 0), None), "logical_or": (lambda a, b: (a != 0) | (b != 0), None),
    "logical_xor": (lambda a, b: (a != 0) ^ (b != 0), None),
}
_BITVEC = {
    "bitwise_and": (torch.bitwise_and, None), "bitwise_or": (torch.bitwise_or, None),
    "bitwise_xor": (torch.bitwise_xor, None), "left_shift": (torch.bitwise_left_shift, None),
    "right_shift": (torch.bitwise_right_shift, None),
}
_CMP = {"equal", "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and", "logical_or",
        "logical_xor"}

OPS = {}
for _n, _f in _UNARY.items():
    OPS[_n] = ElementwiseOp(_n, _f, 1, "cmp" if _n == "logical_not" else "arith")
for _n, (_f, _r) in _BINARY.items():
    OPS[_n] = ElementwiseOp(_n, _f, 2, "cmp" if _n in _CMP else "arith", _r)
for _n, (_f, _r) in _BITVEC.items():
    OPS[_n] = ElementwiseOp(_n, _f, 2, "bitvec", _r)
OPS["bitwise_and"].reduce = "and"
OPS["bitwise_or"].reduce = "or"


def reduce(impl, x, axes, keepdims):
    """Reduces fp32 ``x`` over ``axes`` with a binary op (nl.add, nl.maximum...)."""
    how = impl.reduce
    if how == "sum":
        return x.sum(dim=axes, keepdim=keepdims)
    if how == "amax":
        return x.amax(dim=axes, keepdim=keepdims)
    if how == "amin":
        return x.amin(dim=axes, keepdim=keepdims)
    if how == "prod":
        r = x
        for a in sorted(axes, reverse=True):
            r = r.prod(dim=a, keepdim=keepdims)
        return r
    if how in ("and", "or"):
        r = x.to(torch.int64)
        for a in sorted(axes, reverse=True):
            parts = r.unbind(a)
            acc = parts[0]
            for p in parts[1:]:
                acc = acc & p if how == "and" else acc | p
            r = acc.unsqueeze(a) if keepdims else acc
        return r
    raise ValueError(f"nl.{impl.name} cannot reduce")

