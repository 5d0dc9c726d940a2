"""The errors tessera raises on purpose, under one base class.

A `TesseraError`'s text is written for the person who has to act on it (it names the field, file,
device or claim, and the fix), so the layer that reports it (a claim's answer to kubelet, an
admission response, a CLI line) shows `str(exc)` as it is. Anything else that escapes is a bug:
reported as an internal error, with its traceback in the log.

The subclasses say who has to act. Each keeps the builtin base its classes had before they joined
this hierarchy (ValueError, RuntimeError), so an `except ValueError` written against them still holds.
"""

from __future__ import annotations


class TesseraError(Exception):
    """An error whose message is meant for the user; raise a subclass of it, or of one of the ones below."""


class InvalidInputError(TesseraError, ValueError):
    """Input tessera cannot use (a claim, an opaque config, a flag, a file): the user fixes the input."""


class DeviceError(TesseraError, RuntimeError):
    """A GPU, or the helper that drives it (MIG, MPS, time slicing), refused an operation."""


class NodeStateError(TesseraError, ValueError):
    """What the node agent keeps on disk (checkpoint, state and CDI directories) cannot be trusted."""


class DiscoveryError(TesseraError):
    """Discovery (driver.discovery and its backends) could not produce an inventory.

    The message says where (file, field path) and how to fix it.
    """

    def __init__(self, message: str, *, source: str = "", field_path: str = "") -> None:
        self.message = message
        self.source = source
        self.field_path = field_path
        prefix = ": ".join(part for part in (source, field_path) if part)
        super().__init__(f"{prefix}: {message}" if prefix else message)
