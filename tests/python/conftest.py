import os
import pathlib

import pytest

FIXTURES = pathlib.Path(os.environ.get("PACKPIPE_FIXTURES_DIR",
                                       pathlib.Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures"))
MEGATRON = FIXTURES / "megatron-small"


@pytest.fixture(scope="session")
def megatron():
    assert MEGATRON.is_dir(), f"fixtures not found at {MEGATRON}"
    return MEGATRON


@pytest.fixture(scope="session")
def records(megatron):
    import json
    with open(megatron / "records.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]
