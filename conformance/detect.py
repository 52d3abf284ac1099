"""Choosing the backend: import a descriptor's setup modules and match descriptors to this machine.

Triggered by the plugin's ``--backend auto|NAME`` and by the CLI. Reads the descriptors and torch's
view of the hardware (``torch.accelerator``, ``torch.version``); writes nothing.
"""

from __future__ import annotations

import importlib

from conformance.descriptors import BackendDescriptor, DescriptorError

__all__ = ["detect_backend", "import_setup_modules", "local_accelerator", "matches_here", "resolve_backend"]


def import_setup_modules(descriptor: BackendDescriptor) -> None:
    """Import the modules that register an out-of-tree device or distributed backend."""
    for module in descriptor.setup_modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise DescriptorError(
                f"{descriptor.source}: setup_modules: cannot import {module!r} ({exc}) -> "
                "install the package that provides it, or remove it from setup_modules"
            ) from None


def local_accelerator() -> str:
    """The type of the current accelerator, or "none"."""
    import torch

    accelerator = torch.accelerator.current_accelerator()
    return accelerator.type if accelerator is not None else "none"


def matches_here(descriptor: BackendDescriptor, accelerator: str | None = None) -> bool:
    import torch

    accelerator = local_accelerator() if accelerator is None else accelerator
    if descriptor.detect.accelerator != accelerator:
        return False
    return all(bool(getattr(torch.version, attr, None)) == wanted
               for attr, wanted in descriptor.detect.torch_version.items())


def detect_backend(descriptors: dict[str, BackendDescriptor]) -> BackendDescriptor:
    """The most specific descriptor matching this machine; setup modules are imported first."""
    for descriptor in descriptors.values():
        if descriptor.detect.accelerator not in ("none", "cpu", "cuda", "xpu", "mps"):
            # An out-of-tree device appears only once its module is imported.
            try:
                import_setup_modules(descriptor)
            except DescriptorError:
                continue
    accelerator = local_accelerator()
    found = [d for d in descriptors.values() if matches_here(d, accelerator)]
    if not found:
        raise DescriptorError(
            f"no backend descriptor matches this machine (accelerator: {accelerator}); "
            "add one to a --backends-dir (see backends/privateuse1.yaml.template) or pass --backend NAME"
        )
    found.sort(key=lambda d: d.detect.specificity, reverse=True)
    if len(found) > 1 and found[0].detect.specificity == found[1].detect.specificity:
        names = ", ".join(d.name for d in found)
        raise DescriptorError(f"several descriptors match this machine equally ({names}); pass --backend NAME")
    return found[0]


def resolve_backend(name: str, descriptors: dict[str, BackendDescriptor]) -> BackendDescriptor:
    """``auto`` detects; a name must be one of the loaded descriptors."""
    if name == "auto":
        descriptor = detect_backend(descriptors)
    elif name in descriptors:
        descriptor = descriptors[name]
    else:
        raise DescriptorError(f"unknown backend {name!r}; known: {', '.join(sorted(descriptors))} or auto")
    import_setup_modules(descriptor)
    return descriptor
