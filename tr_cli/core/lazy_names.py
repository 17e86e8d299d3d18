"""Package names that load their modules on first use (PEP 562), so that importing a package for
one light name (a default, an error class) does not import torch or transformers with it: the
command line's --help and argument checks must start at once."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` for `package`: each name in `homes` imported from its module
    (relative to the package) when first asked for, then kept in the package."""

    def attribute(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(package)
        value = getattr(importlib.import_module(home, package), name)
        setattr(module, name, value)
        return value

    return attribute
