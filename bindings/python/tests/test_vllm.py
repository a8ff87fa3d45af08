"""kvtier.vllm without vLLM: the module imports with its own stand-ins of vLLM's base
classes, and checks kv_connector_extra_config. Everything else about the connector is judged
by vLLM's own code in test_vllm_scheduler.py (VLLM_SRC)."""
import os
import sys
import types

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvtier  # noqa: E402
import kvtier.vllm  # noqa: E402


def vllm_config(**extra):
    extra = dict(dict(g2_blocks=50), **extra)
    return types.SimpleNamespace(
        kv_transfer_config=types.SimpleNamespace(
            kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm",
            kv_role="kv_both", kv_connector_extra_config=extra, engine_id="0"),
        cache_config=types.SimpleNamespace(block_size=16, enable_prefix_caching=True),
        parallel_config=types.SimpleNamespace(world_size=1))


def test_loaded_by_module_path_without_vllm():
    if "vllm.distributed" in sys.modules:
        pytest.skip("vLLM is loaded in this process: kvtier.vllm uses vLLM's base classes")
    assert kvtier.vllm.KvtierConnector.__module__ == "kvtier.vllm"
    assert issubclass(kvtier.vllm.KvtierConnectorMetadata, kvtier.vllm.KVConnectorMetadata)
    assert kvtier.vllm.KvtierConnector.requires_piecewise_for_cudagraph({}) is True
    c = kvtier.vllm.KvtierConnector(vllm_config(), kvtier.vllm.KVConnectorRole.SCHEDULER,
                                    types.SimpleNamespace(num_blocks=8))
    try:
        assert c.role == kvtier.vllm.KVConnectorRole.SCHEDULER
    finally:
        c.shutdown()


@pytest.mark.parametrize("bad", [dict(store_tier="G4"), dict(offload="sometimes"),
                                 dict(g2_block=5)])
def test_extra_config_is_checked(bad):
    with pytest.raises(ValueError):
        kvtier.vllm.KvtierConnector(vllm_config(**bad), kvtier.vllm.KVConnectorRole.SCHEDULER,
                                    types.SimpleNamespace(num_blocks=8))


def test_gpu_blocks_and_ranks_are_checked():
    worker = kvtier.vllm.KVConnectorRole.WORKER
    with pytest.raises(ValueError):  # G1's size comes from kv_cache_config or the config
        kvtier.vllm.KvtierConnector(vllm_config(), worker)
    config = vllm_config()
    config.parallel_config.world_size = 2
    # Two workers both taken as rank 0 would report as one rank twice.
    with pytest.raises(ValueError, match="needs parallel_config.rank"):
        kvtier.vllm.KvtierConnector(config, worker, types.SimpleNamespace(num_blocks=8))
    config.parallel_config.rank = 2
    with pytest.raises(ValueError, match="rank 2 is not in"):
        kvtier.vllm.KvtierConnector(config, worker, types.SimpleNamespace(num_blocks=8))
