import pytest

from mha_export import MHAConfig

SMALL = dict(dim=64, heads=4, max_seq_len=32)


@pytest.fixture
def small_config():
    return MHAConfig(**SMALL)
