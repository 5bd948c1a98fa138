"""Named errors for calls into the native core.

pybind11 answers a call whose argument has the wrong type with "incompatible function arguments" and
a dump of every signature. wrap_core() wraps the core's functions, constructors and methods so that
such a call names the function and the argument, what it must be and what was found (a TypeError
still); every other outcome, and every other error, is the native call's own.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

from packpipe import _check


def mismatch(where: str, fn: Callable, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[str]:
    """The first argument of a call of `fn` that its signature refuses, as a message; None when it
    cannot be told (an overloaded function: pybind's own message stands)."""
    try:
        sig = _check.native_signature(fn)
    except ValueError:
        return None
    if not sig:
        return None
    names = list(sig)
    own = "self" in sig
    if len(args) > _positional(fn):
        keywords = [n for n in names[_positional(fn):]]
        return (f"{where}: takes {_positional(fn) - own} positional argument(s), found {len(args) - own}"
                + (f" (keyword-only: {', '.join(keywords)})" if keywords else ""))
    for name in kwargs:
        if name not in sig:
            return (f"{where}: unknown keyword argument '{name}' (the keywords are "
                    f"{', '.join(n for n in names if n != 'self')})")
    given = dict(zip(names, args))
    given.update(kwargs)
    for name, value in given.items():
        if name != "self" and not _check._has_type(value, sig[name]):
            return f"{where}: {name} must be {sig[name]}, found {_check._found(value)}"
    missing = [n for n in _required(fn) if n not in given]
    if missing:
        return f"{where}: missing argument{'s' if len(missing) > 1 else ''} {', '.join(repr(n) for n in missing)}"
    # a type this check cannot tell apart: the signature and what was given, in one line each
    shown = ", ".join([type(v).__name__ for v in args[("self" in sig):]] +
                      [f"{k}={type(v).__name__}" for k, v in kwargs.items()])
    return (f"{where}: the arguments do not match its parameters "
            f"({', '.join(f'{n}: {t}' for n, t in sig.items() if n != 'self')}); found ({shown})")


def _required(fn: Callable) -> list:
    """The parameters of a native function without a default."""
    return [p.split(":", 1)[0] for p in _check.signature_parts(fn)
            if p.split(":", 1)[0].isidentifier() and not p.startswith("self") and " = " not in p]


def _positional(fn: Callable) -> int:
    """How many parameters (self included) may be given by position: those before a bare '*'."""
    parts = _check.signature_parts(fn)
    return parts.index("*") if "*" in parts else len(parts)


def wrap(fn: Callable, where: str) -> Callable:
    """`fn` (a native function or method) whose argument-type TypeError names the argument."""
    own = f"{getattr(fn, '__name__', '')}(): incompatible"

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            error = e
            if isinstance(e, TypeError) and str(e).startswith(own):  # not raised inside: this call's arguments
                text = mismatch(where, fn, args, kwargs)
                if text is not None:
                    error = TypeError(text)
        # Raised outside the handler, with the arguments let go: an error's traceback holds this
        # frame, and must not keep the caller's objects (an open writer, say) alive with it.
        args = kwargs = None
        try:
            raise error
        finally:
            error = None
    call.__packpipe_native__ = fn
    return call


def wrap_core(namespace: Dict[str, Any], core) -> None:
    """Wraps the core's functions in `namespace` (the package's) and its classes' constructors,
    methods and static methods in place."""
    for name, value in list(vars(core).items()):
        if name.startswith("_"):
            continue
        if type(value).__name__ == "builtin_function_or_method":
            namespace[name] = wrap(value, name)
        elif isinstance(value, type) and value.__module__.startswith("packpipe"):
            for attr, member in list(vars(value).items()):
                if attr.startswith("__") and attr != "__init__":
                    continue
                where = name if attr == "__init__" else f"{name}.{attr}"
                if type(member).__name__ == "instancemethod":
                    setattr(value, attr, wrap(member.__func__ if hasattr(member, "__func__") else member, where))
                elif isinstance(member, staticmethod):
                    setattr(value, attr, staticmethod(wrap(member.__func__, where)))
