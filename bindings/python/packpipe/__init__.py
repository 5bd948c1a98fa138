"""packpipe: dynamic micro-batching and pipeline planning for multi-task training.

The native core lives in ``packpipe._core``; this package re-exports it. partition(),
plan_batch() and static_memory() come through ``packpipe._compat``, which also accepts the deprecated call forms of
packpipe 0.1 (with a DeprecationWarning) until packpipe 0.2. A native call given an argument of the
wrong type raises a TypeError naming the function and the argument (``packpipe._errors``).
"""
from packpipe._core import *  # noqa: F401,F403
from packpipe._core import __version__  # noqa: F401
from packpipe import _core as _native, _errors

_errors.wrap_core(globals(), _native)  # an argument of the wrong type is named, not a signature dump
from packpipe._compat import partition, plan_batch, static_memory  # noqa: F401
