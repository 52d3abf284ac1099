"""Choosing the backend: import a descriptor's setup modules and match descriptors to this machine.

Triggered by the plugin's ``--backend auto|NAME`` and by the CLI. Reads the descriptors and torch's
view of the hardware (``torch.accelerator``, ``torch.version``); writes nothing.
"""

from __future__ import annotations

import importlib

from conformance.descriptors import BackendDescriptor, DescriptorError

__all__ = ["absent_accelerator_note", "build_accelerator", "detect_backend", "import_setup_modules",
           "local_accelerator", "matches_here", "resolve_backend"]


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
    """The type of the accelerator present here, or "none": a CUDA, ROCm or XPU build of torch on a machine
    without such a device (the default wheel on a CI runner or a laptop) has none, and runs as CPU."""
    import torch

    try:
        accelerator = torch.accelerator.current_accelerator(check_available=True)
    except TypeError:  # a torch whose current_accelerator has no check_available: count the devices
        accelerator = torch.accelerator.current_accelerator()
        if accelerator is not None and torch.accelerator.device_count() == 0:
            accelerator = None
    return accelerator.type if accelerator is not None else "none"


def build_accelerator() -> str:
    """The accelerator torch was built for ("cuda" for the default wheel), present or not, or "none"."""
    import torch

    accelerator = torch.accelerator.current_accelerator()
    return accelerator.type if accelerator is not None else "none"


def absent_accelerator_note() -> str | None:
    """One line when torch is built for an accelerator this machine does not have, else None."""
    import torch

    built = build_accelerator()
    if built == "none" or local_accelerator() != "none":
        return None
    return (f"torch {torch.__version__} is a {built} build, but this machine has no {built} device: "
            "detection follows the devices present")


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
