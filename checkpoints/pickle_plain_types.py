"""Inert stand-ins for the plain Python and numpy values a DeepSpeed client_state may hold, for the weights-only
unpickler of deepspeed_pickle.py.

Scripts pass `save_checkpoint(client_state=...)` their argparse Namespace, numpy scalars (a seed, a metric) and
arrays (np.random.get_state()). pickle rebuilds those through argparse.Namespace, numpy's `scalar` and
`_reconstruct`: none of them is ever imported or called here. Each name maps to a stand-in that keeps plain data
only: a Namespace's attributes (text names), a numpy value's bytes for a dtype of numbers, booleans or text.
Anything else becomes a stand-in whose `problem` says what it held, and deepspeed_pickle.walk refuses it.
"""

from __future__ import annotations

import argparse
import math
from typing import Any


class NumpyDtype:
    """Stand-in for numpy.dtype as pickled (`dtype(name, align, copy)` then its byte order): plain kinds only."""

    def __init__(self, name: Any = None, *_: Any) -> None:
        self.name, self.order = name, "="

    def __setstate__(self, state: Any) -> None:
        self.order = state[1] if isinstance(state, tuple) and len(state) > 1 and state[1] in "<>|=" else "?"

    def real(self) -> Any:
        """The numpy dtype; None for object, structured or unknown ones (never read from a file)."""
        import numpy as np

        ok = isinstance(self.name, str) and len(self.name) < 8 and (self.name.isalnum() or self.name == "?") \
            and self.name[:1] in "biufcSU?" and self.order != "?"
        return np.dtype(self.order + self.name if self.order in "<>" else self.name) if ok else None


class NumpyArray:
    """Stand-in for a pickled numpy array: `array` rebuilt from its bytes for a plain dtype, else `problem` says
    why not (walk refuses it); numpy's own reconstruction, which can rebuild any object, is never called."""

    def __init__(self, *_: Any) -> None:
        self.array, self.problem = None, "an array numpy did not pickle"

    def __setstate__(self, state: Any) -> None:
        import numpy as np

        _, shape, dtype, fortran, raw = (*state, None, None, None, None, None)[:5] if isinstance(state, tuple) \
            else (None,) * 5
        real = dtype.real() if isinstance(dtype, NumpyDtype) else None
        if real is None or not isinstance(raw, bytes):
            self.problem = f"a numpy array of dtype {getattr(dtype, 'name', '?')!s:.20} (objects or records)"
            return
        sizes = shape if isinstance(shape, tuple) and all(type(d) is int and d >= 0 for d in shape) else None
        if sizes is None or math.prod(sizes) * real.itemsize != len(raw):
            self.problem = "a numpy array whose bytes do not match its shape"
            return
        flat = np.frombuffer(raw, dtype=real).copy()
        self.array, self.problem = flat.reshape(sizes, order="F" if fortran else "C"), None


def _reconstruct(*_: Any) -> NumpyArray:
    return NumpyArray()


def _scalar(dtype: Any = None, raw: Any = None, *_: Any) -> Any:
    """Stand-in for numpy's `scalar(dtype, bytes)` (how np.int64(7) and its kin pickle): the numpy scalar for a
    plain dtype whose bytes are exactly one value; else a NumpyArray stand-in whose `problem` says why not."""
    import numpy as np

    real = dtype.real() if isinstance(dtype, NumpyDtype) else None
    if real is not None and isinstance(raw, bytes) and len(raw) == real.itemsize:
        return np.frombuffer(raw, dtype=real)[0].copy()
    refused = NumpyArray()
    refused.problem = f"a numpy scalar of dtype {getattr(dtype, 'name', '?')!s:.20} (objects, or bytes of another size)"
    return refused


class PickledNamespace:
    """Stand-in for argparse.Namespace (a script's `args`): its attributes as a dict of text names, nothing set
    through setattr; `namespace()` gives the real Namespace once its values are read."""

    attrs: dict[str, Any]
    problem: str | None

    def __new__(cls, *args: Any) -> "PickledNamespace":  # pickle makes it with __new__ alone (NEWOBJ, no args)
        made = super().__new__(cls)
        made.attrs, made.problem = {}, "a Namespace argparse did not pickle" if args else None
        return made

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict) and all(type(k) is str for k in state):
            self.attrs = state
        else:
            self.problem = "a Namespace whose attributes are not a dict of names"

    def namespace(self, values: dict[str, Any]) -> argparse.Namespace:
        made = argparse.Namespace()
        vars(made).update(values)  # not setattr: a name such as __class__ stays a plain attribute
        return made


# pickle's names for those values, mapped to the stand-ins (numpy 2 moved numpy.core to numpy._core)
PLAIN_TYPES: dict[str, Any] = {
    "numpy._core.multiarray._reconstruct": _reconstruct, "numpy.core.multiarray._reconstruct": _reconstruct,
    "numpy._core.multiarray.scalar": _scalar, "numpy.core.multiarray.scalar": _scalar,
    "numpy.ndarray": NumpyArray, "numpy.dtype": NumpyDtype, "argparse.Namespace": PickledNamespace,
}
REFUSABLE = (NumpyArray, PickledNamespace)  # stand-ins that may carry a `problem`
