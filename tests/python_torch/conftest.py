"""pytest configuration of the packpipe.torch tests: the `timing` marker.

A test marked `timing` asserts on times measured on this machine. ctest runs those alone
(tests/CMakeLists.txt: python_torch.timing, RUN_SERIAL) and the others beside other tests
(python_torch, -m "not timing"); each still holds with another process loading the CPU.
"""


def pytest_configure(config):
    config.addinivalue_line("markers", "timing: asserts on measured times; ctest runs it alone (RUN_SERIAL)")
