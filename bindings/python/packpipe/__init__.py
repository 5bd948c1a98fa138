"""packpipe: dynamic micro-batching and pipeline planning for multi-task training.

The native core lives in ``packpipe._core``; this package re-exports it.
"""
from packpipe._core import *  # noqa: F401,F403
from packpipe._core import __version__  # noqa: F401
