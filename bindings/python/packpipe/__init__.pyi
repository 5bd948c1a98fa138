"""Type stubs of the packpipe package: everything of packpipe._core (see _core.pyi)."""
from packpipe._core import *  # noqa: F401,F403
from packpipe._core import __version__ as __version__
