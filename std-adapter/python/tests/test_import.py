"""The plugin imports against vLLM's real modules."""


def test_kvtier_imports_without_vllm_modules_loaded():
    import kvtier

    assert kvtier.__version__


def test_vllm_modules_are_real():
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    import kvtier.vllm as kv

    assert CPUOffloadingManager.__module__ == "vllm.v1.kv_offload.cpu.manager"
    assert issubclass(kv.KvtierOffloadingManager, kv.OffloadingManager)
