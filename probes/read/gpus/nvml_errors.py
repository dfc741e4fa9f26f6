"""What a call into NVML raises, so that the readers catch that and nothing else."""

from __future__ import annotations

from types import ModuleType


def nvml_errors(nvml: ModuleType | None) -> tuple[type[BaseException], ...]:
    """pynvml's ``NVMLError_*`` (and its library-mismatch error), a function older bindings lack
    (AttributeError) and what ctypes raises on a library it cannot load or call."""
    import ctypes  # loaded with pynvml already: imported here so that a host without NVML never pays for it

    named = (getattr(nvml, "NVMLError", None), getattr(nvml, "NVMLLibraryMismatchError", None))
    return tuple(c for c in named if isinstance(c, type)) + (OSError, AttributeError, ctypes.ArgumentError)
