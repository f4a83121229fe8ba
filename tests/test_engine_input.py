"""The OpenCL engine refuses what it cannot run with a clear error, and its
options (pool size, KV fraction, kernel family) are checked at construction.
(`engine` is conftest's: the tiny model, on each kernel family.)"""

from __future__ import annotations

import pytest

from gpu.engine import OpenCLEngine
from gpu.model.load import Model
from runtime.errors import ConfigError
from runtime.scheduling.work import Work


def test_block_table_too_short_is_a_clear_error(engine: OpenCLEngine) -> None:
    with pytest.raises(ValueError, match=r"block table of 1 blocks covers 16 positions, the work reaches position 16"):
        engine.step([Work(turn=0, tokens=[1, 2], start=15, block_table=[0], sample=True)])


def test_block_id_outside_the_pool_is_a_clear_error(engine: OpenCLEngine) -> None:
    with pytest.raises(ValueError, match="outside the pool of 64 blocks"):
        engine.step([Work(turn=0, tokens=[1], start=0, block_table=[64], sample=True)])


def test_two_items_for_one_turn_are_rejected(engine: OpenCLEngine) -> None:
    with pytest.raises(ValueError, match="at most one Work per turn"):
        engine.step([Work(turn=0, tokens=[1], start=0, block_table=[0], sample=True)] * 2)


def test_token_outside_the_vocabulary_is_rejected(engine: OpenCLEngine) -> None:
    with pytest.raises(ValueError, match="token ids must be in"):
        engine.step([Work(turn=0, tokens=[engine.config.vocab_size], start=0, block_table=[0], sample=True)])


def test_pool_and_block_size_are_checked(tiny_model: Model) -> None:
    with pytest.raises(ConfigError, match="multiple of 16"):
        OpenCLEngine(tiny_model, block_size=8, num_blocks=4)
    with pytest.raises(ConfigError, match="largest allocation"):
        OpenCLEngine(tiny_model, num_blocks=10**9)
    with pytest.raises(ConfigError, match="kv_fraction"):
        OpenCLEngine(tiny_model, kv_fraction=1.5)


def test_default_pool_follows_the_kv_fraction(tiny_model: Model) -> None:
    small = OpenCLEngine(tiny_model, kv_fraction=0.01)
    large = OpenCLEngine(tiny_model, kv_fraction=0.02)
    assert 0 < small.num_blocks < large.num_blocks
    assert 2 * large.num_blocks * large.kv.block_bytes <= 0.02 * large.device.global_mem


def test_kernel_family_follows_the_device_unless_forced(tiny_model: Model) -> None:
    auto = OpenCLEngine(tiny_model, num_blocks=4)
    assert auto.kernels == ("cpu" if auto.device.is_cpu else "gpu")
    assert OpenCLEngine(tiny_model, num_blocks=4, kernels="gpu").kernels == "gpu"
    with pytest.raises(ConfigError, match="kernels must be one of auto, cpu, gpu"):
        OpenCLEngine(tiny_model, num_blocks=4, kernels="tpu")
