"""The plugin imports against vLLM's real modules."""


def test_kvtier_imports_without_vllm_modules_loaded():
    import kvtier

    assert kvtier.__version__


def test_vllm_modules_are_real():
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    import kvtier.vllm as kv

    assert CPUOffloadingManager.__module__ == "vllm.v1.kv_offload.cpu.manager"
    assert issubclass(kv.KvtierOffloadingManager, kv.OffloadingManager)


def test_the_package_ships_its_types_and_the_stubs_match_the_extension():
    """PEP 561: ``py.typed`` marks the package typed, and ``_native.pyi`` describes the Rust
    extension: the same classes, the same public methods, the same parameters."""
    import ast
    import inspect
    import pathlib

    import kvtier
    from kvtier import _native

    here = pathlib.Path(kvtier.__file__).parent
    assert (here / "py.typed").is_file()
    stub = ast.parse((here / "_native.pyi").read_text())
    classes = {c.name: c for c in stub.body if isinstance(c, ast.ClassDef)}
    assert set(classes) == {n for n in _native.__all__ if isinstance(getattr(_native, n), type)}
    for name, node in classes.items():
        cls = getattr(_native, name)
        stubbed = {
            f.name: [a.arg for a in f.args.args]
            for f in node.body
            if isinstance(f, ast.FunctionDef)
        }
        public = [n for n in dir(cls) if not n.startswith("_")]
        assert sorted(n for n in stubbed if not n.startswith("_")) == sorted(public), name
        for method in public:
            sig = inspect.signature(getattr(cls, method))
            assert list(sig.parameters) == stubbed[method], f"{name}.{method}"
        if "__init__" in stubbed:
            sig = inspect.signature(cls)
            assert ["self", *sig.parameters] == stubbed["__init__"], f"{name}.__init__"
