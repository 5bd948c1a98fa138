"""Argument checks of packpipe's Python entry points (PlanLoader, Calibrator, PipelineRunner,
LocalPipeline, the launcher, ``packpipe profile``, the examples and benchmarks).

Every check names the entry point and the argument and says what was expected and what was found:
TypeError for a value of the wrong type (a bool is not an integer, a float is not an integer even
when it is whole, an integer or a string is not a bool), ValueError for one out of range; nothing
is coerced. The ``arg_*`` factories are
the same checks as argparse ``type=`` functions, so a command line fails with an argparse error
(exit 2, usage) before any work.
"""
from __future__ import annotations

import argparse
import math
import numbers
import os
import re
from typing import Any, Callable, Dict, Iterable, Optional

MAX_COUNT = 2 ** 40          # iterations, iteration numbers, tokens: far above any real job
MAX_EPOCH = 2 ** 32
MAX_PIPELINE = 2 ** 16       # stages, replicas, ranks, tp (partition::kMaxPipelineSize)
MAX_DEPTH = 256              # iterations a loader holds ready (each holds its tensors in memory)
MAX_TIMEOUT_S = 1e9          # as the CLI's --timeout
MAX_THREADS = 1024           # as the CLI's --threads
INT64 = (-2 ** 63, 2 ** 63 - 1)


def _found(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


def integer(where: str, name: str, value: Any, lo: int, hi: int) -> int:
    """`value` as an int in [lo, hi]: TypeError for a bool, float, str or other non-integer;
    ValueError out of range. numpy integers are integers."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be an integer in [{lo}, {hi}], found {_found(value)}")
    v = int(value)
    if not lo <= v <= hi:
        raise ValueError(f"{where}: {name} must be in [{lo}, {hi}], found {v}")
    return v


def number(where: str, name: str, value: Any, lo: float, hi: float, *, lo_open: bool = False) -> float:
    """`value` as a finite float in [lo, hi] ((lo, hi] with `lo_open`): TypeError for a bool or a
    non-number, ValueError for NaN, an infinity or a value out of range."""
    span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: {name} must be a number in {span}, found {_found(value)}")
    v = float(value)
    if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
        raise ValueError(f"{where}: {name} must be a finite number in {span}, found {v!r}")
    return v


def is_boolean(value: Any) -> bool:
    """True for the values a bool argument takes: True, False and numpy bools."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"))


def boolean(where: str, name: str, value: Any) -> bool:
    """`value` as a bool: True, False or a numpy bool; TypeError for anything else (1, 0, 2.5, 'no',
    'False', None), never a truth-value cast."""
    if not is_boolean(value):
        raise TypeError(f"{where}: {name} must be True or False, found {_found(value)}")
    return bool(value)


def one_of(where: str, name: str, value: Any, choices: Iterable[str]) -> str:
    choices = list(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{where}: {name} must be one of {', '.join(choices)}, found {value!r}")
    return value


def path(where: str, name: str, value: Any) -> str:
    """A path argument (str or os.PathLike) as a non-empty str."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{where}: {name} must be a path (str or os.PathLike), found {_found(value)}")
    p = os.fspath(value)
    if not isinstance(p, str):
        raise TypeError(f"{where}: {name} must be a str path, found {_found(p)}")
    if not p:
        raise ValueError(f"{where}: {name} is an empty path")
    return p


def paths(where: str, name: str, value: Any) -> list:
    """A sequence of paths (not one str: its characters would be taken for paths) as a list of str."""
    if isinstance(value, (str, bytes, os.PathLike)) or not isinstance(value, Iterable):
        raise TypeError(f"{where}: {name} must be a sequence of paths, found {_found(value)}")
    return [path(where, f"{name}[{i}]", p) for i, p in enumerate(value)]


def instance(where: str, name: str, value: Any, cls, expected: Optional[str] = None):
    if not isinstance(value, cls):
        raise TypeError(f"{where}: {name} must be {expected or getattr(cls, '__name__', cls)}, found "
                        f"{_found(value)}")
    return value


def keywords(where: str, given: Dict[str, Any], fn: Callable, exclude: Iterable[str] = ()) -> None:
    """Checks keyword arguments meant for the native function `fn` before it is called: an unknown
    name is a TypeError listing the known ones, and a value whose type the binding would refuse
    (bound classes, str, bool, float, int, List[int]) a TypeError naming it, instead of pybind11's
    dump of the whole signature. Values of type ``object`` are the binding's to check."""
    sig = native_signature(fn)
    allowed = {k: v for k, v in sig.items() if k not in set(exclude)}
    for name, value in given.items():
        if name not in allowed:
            raise TypeError(f"{where}: unknown keyword argument '{name}' (the keywords are "
                            f"{', '.join(sorted(allowed))})")
        expected = allowed[name]
        if not _has_type(value, expected):
            raise TypeError(f"{where}: {name} must be {expected}, found {_found(value)}")


def signature_parts(fn: Callable) -> list:
    """The parameter texts ("name: type = default", "*") of a pybind11 function's signature line."""
    line = (fn.__doc__ or "").strip().splitlines()[0]
    inner = line[line.index("(") + 1:line.rindex(")")]
    depth, start, parts = 0, 0, []
    for i, ch in enumerate(inner):  # split on top-level commas (defaults hold reprs with commas)
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    return [p.strip() for p in parts]


def native_signature(fn: Callable) -> Dict[str, str]:
    """{parameter: annotated type} of a pybind11 function, from its signature line."""
    out = {}
    for p in signature_parts(fn):
        m = re.match(r"\s*(\w+): ([^=]+?)(?: = .*)?$", p)
        if m:  # builtins.bool: a bool the binding checks itself (BoolArg), a bool here
            out[m.group(1)] = re.sub(r"\bbuiltins\.", "", m.group(2).strip())
    return out


def _has_type(value: Any, expected: str) -> bool:
    if expected == "object":
        return True
    if expected == "str":
        return isinstance(value, str)
    if expected == "bool":
        return is_boolean(value)
    if expected == "float":
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if expected in ("int", "typing.SupportsIndex"):
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if expected == "typing.SupportsFloat":
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if expected == "dict" or expected.startswith("Dict["):
        return isinstance(value, dict)
    if expected == "list":
        return isinstance(value, list)
    if expected == "bytes":
        return isinstance(value, (bytes, bytearray, memoryview))
    if expected.startswith("numpy.ndarray"):  # what numpy can read as numbers (pybind converts it)
        import numpy as np
        try:
            return np.asarray(value).dtype.kind in "biuf"
        except (TypeError, ValueError):
            return False
    m = re.fullmatch(r"List\[(.+)\]", expected)
    if m:
        return isinstance(value, (list, tuple)) and all(_has_type(x, m.group(1)) for x in value)
    m = re.fullmatch(r"Optional\[(.+)\]", expected)
    if m:
        return value is None or _has_type(value, m.group(1))
    if expected.startswith("packpipe._core."):
        import packpipe._core as core
        cls = getattr(core, expected.rsplit(".", 1)[1], None)
        return cls is None or isinstance(value, cls)
    return True  # an annotation this check does not know: the binding checks it


# ---- argparse ``type=`` functions ------------------------------------------------------------

def arg_int(lo: int, hi: int, what: str = "") -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi] (`what` says what the value means, e.g. '0: never')."""
    note = f" ({what})" if what else ""

    def parse(text: str) -> int:
        try:
            v = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in [{lo}, {hi}]{note}, found '{text}'") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}]{note}, found {v}")
        return v
    parse.__name__ = "integer"
    return parse


def arg_float(lo: float, hi: float, what: str = "", *, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [lo, hi] ((lo, hi] with `lo_open`)."""
    span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
    note = f" ({what})" if what else ""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {span}{note}, found '{text}'") from None
        if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
            raise argparse.ArgumentTypeError(f"must be a finite number in {span}{note}, found {text}")
        return v
    parse.__name__ = "number"
    return parse


def arg_device(text: str):
    """An argparse type: a torch device this machine has, cpu or cuda[:N] (imports torch)."""
    import torch
    try:
        device = torch.device(text)
    except RuntimeError as e:
        raise argparse.ArgumentTypeError(f"'{text}' is not a torch device: {e}") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu or cuda, found '{text}'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"'{text}': this torch sees no CUDA device")
    return device


def arg_ints(lo: int, hi: int, what: str = "") -> Callable[[str], list]:
    """An argparse type: comma-separated integers, each in [lo, hi], at least one."""
    one = arg_int(lo, hi, what)

    def parse(text: str) -> list:
        items = [x for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers in [{lo}, {hi}], found '{text}'")
        return [one(x.strip()) for x in items]
    parse.__name__ = "integer list"
    return parse
