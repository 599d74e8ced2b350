"""A package's public names imported on first use (PEP 562's module __getattr__), from its `_LAZY` table:
name -> the submodule that defines it. tools/layers.py reads the same tables as imports."""

from importlib import import_module


def lazy_getattr(package: str, table: dict, namespace: dict):
    """The module __getattr__ of `package`: a name in `table` is imported from its submodule and kept in
    `namespace` (the package's globals), so the import happens once; any other name is an AttributeError."""

    def __getattr__(name):
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(import_module(f".{table[name]}", package), name)
        return value

    return __getattr__
