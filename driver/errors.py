"""The errors tessera raises on purpose, under one base class.

A `TesseraError`'s text is written for the person who has to act on it (it names the field, file,
device or claim, and the fix), so the layer that reports it (a claim's answer to kubelet, an
admission response, a CLI line) shows `str(exc)` as it is. Anything else that escapes is a bug:
reported as an internal error, with its traceback in the log.

The family, with the module of each class and its `reason` (the label of the node agent's
`tessera_claim_errors_total` metric and of the log line that reports it):

    TesseraError                                   error
    ├── InvalidInputError (ValueError)             invalid_input      the user fixes the input
    │   ├── driver.config.ConfigError              config             an opaque GpuConfig
    │   ├── driver.allocation.AllocationError      allocation         a claim's allocation, on this node
    │   ├── driver.cdi.CdiError                    cdi                a claim uid or device name for a CDI spec
    │   ├── driver.attributes.AttributeValueError  attribute_value
    │   ├── driver.driverroot.DriverRootError      driver_root        --cdi-driver-root
    │   ├── driver.safeyaml.YamlLimitError         yaml_limit
    │   ├── driver.slices.SliceBuildError          slice_build
    │   ├── driver.cel.errors.DeviceViewError      device_view
    │   ├── controller.admission.ReviewError       review
    │   ├── kubeletplugin.pluginconfig.PluginConfigError  plugin_config  a kubelet-plugin flag
    │   └── kubeletplugin.nodelabels.NodeLabelError  node_label    a node label a flag names
    ├── DeviceError (RuntimeError)                 device             a GPU or its helper refused
    │   ├── kubeletplugin.migmanager.MigError      mig
    │   ├── kubeletplugin.mps.MpsError             mps
    │   └── kubeletplugin.timeslicing.TimeSliceError  time_slice
    ├── NodeStateError (ValueError)                node_state         what the node agent keeps on disk
    │   ├── kubeletplugin.checkpoint.CheckpointError  checkpoint
    │   │   └── CheckpointFromNewerBuild           checkpoint_newer_build
    │   └── kubeletplugin.fsguard.UnsafeDirectoryError  unsafe_directory
    ├── DiscoveryError                             discovery          no inventory (NVML, profile)
    ├── kubeletplugin.state.ConflictError (ValueError)  conflict      another prepared claim holds the GPU
    ├── kubeletplugin.grpcservers.SocketError      socket
    ├── driver.kubeapi.ApiError                    apiserver          (its HTTP reason phrase: http_reason)
    ├── driver.kubeapi.KubeConfigError             kube_config        no usable kubeconfig or in-cluster config
    ├── driver.cel.errors: CelCompileError, CelRuntimeError, CelBudgetExceeded; driver.cel.syntax.CelSyntaxError;
    │   driver.cel.selector.CelEngineMissing       (reason from the class name, e.g. cel_compile)
    └── tessera.clusterread.ReadError              read

Each class states its own `reason`; a subclass that does not gets one made from its name
(`CelCompileError` -> `cel_compile`), so every class has a label of its own. Each keeps the builtin
base its classes had before they joined this hierarchy (ValueError, RuntimeError), so an
`except ValueError` written against them still holds.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar


def _reason_from_name(name: str) -> str:
    stem = name.removesuffix("Error") or name
    return re.sub(r"(?<!^)(?=[A-Z])", "_", stem).lower()


class TesseraError(Exception):
    """An error whose message is meant for the user; raise a subclass of it, or of one of the ones below."""

    reason: ClassVar[str] = "error"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "reason" not in cls.__dict__:
            cls.reason = _reason_from_name(cls.__name__)


class InvalidInputError(TesseraError, ValueError):
    """Input tessera cannot use (a claim, an opaque config, a flag, a file): the user fixes the input."""

    reason = "invalid_input"


class DeviceError(TesseraError, RuntimeError):
    """A GPU, or the helper that drives it (MIG, MPS, time slicing), refused an operation."""

    reason = "device"


class NodeStateError(TesseraError, ValueError):
    """What the node agent keeps on disk (checkpoint, state and CDI directories) cannot be trusted."""

    reason = "node_state"


class DiscoveryError(TesseraError):
    """Discovery (driver.discovery and its backends) could not produce an inventory.

    The message says where (file, field path) and how to fix it.
    """

    reason = "discovery"

    def __init__(self, message: str, *, source: str = "", field_path: str = "") -> None:
        self.message = message
        self.source = source
        self.field_path = field_path
        prefix = ": ".join(part for part in (source, field_path) if part)
        super().__init__(f"{prefix}: {message}" if prefix else message)
