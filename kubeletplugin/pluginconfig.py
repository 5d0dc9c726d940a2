"""The node agent's configuration: one dataclass, and the `tessera kubelet-plugin` flags derived from it.

Every setting is a field of `PluginConfig`; a field with a `Flag` in its metadata is a command-line
flag, with the field's default as the flag's default, so a default is written once. The GPU backend
has no default: a node agent started without `--nvml` or `--simulate PROFILE` refuses to start
instead of publishing simulated GPUs on a real node.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from driver.errors import InvalidInputError
from driver.health import HealthPolicy
from driver.slices import MIG_STRATEGIES
from kubeletplugin.metrics import parse_listen_address

if TYPE_CHECKING:
    from kubeletplugin.grpcservers import SocketPaths


class PluginConfigError(InvalidInputError):
    """A command-line setting that cannot work; the message names the flag and the fix."""

    reason = "plugin_config"


@dataclass(frozen=True)
class Flag:
    """How a PluginConfig field appears on the command line."""

    name: str
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    backend: bool = False  # one of the mutually exclusive GPU backends
    parse: Callable[[str], Any] | None = None  # text -> field value; raises ValueError naming the problem


def _flag(name: str, help: str, **kwargs: Any) -> dict[str, Flag]:
    return {"flag": Flag(name, help, **kwargs)}


def _absolute(text: str) -> Path:
    # relative paths are taken from the working directory, as every other tool does
    return Path(text).absolute()


def _health_policy(text: str) -> HealthPolicy:
    return HealthPolicy.from_mapping(json.loads(text) if text else None, "--health-policy")


@dataclass(frozen=True)
class PluginConfig:
    """Everything `tessera kubelet-plugin` takes from its flags."""

    node_name: str = field(metadata=_flag(
        "--node-name", "this node's name (the pool name of its ResourceSlices)"))
    simulate: str | None = field(default=None, metadata=_flag(
        "--simulate", "simulated GPUs: a built-in profile name (dgx-h100-8, a100-pcie-4, a100-pcie-8-mig, t4-4, "
        "mixed, h100-16-mig) or a profile YAML path", metavar="PROFILE", backend=True))
    nvml: bool = field(default=False, metadata=_flag(
        "--nvml", "discover the node's real GPUs through NVML", backend=True))
    kubeconfig: str | None = field(default=None, metadata=_flag(
        "--kubeconfig", "kubeconfig file (default: in-cluster config, then ~/.kube/config)"))
    kubelet_dir: Path = field(default=Path("/var/lib/kubelet"), metadata=_flag(
        "--kubelet-dir", "kubelet's root directory; sockets go under plugins_registry/ and plugins/", parse=_absolute))
    cdi_dir: Path = field(default=Path("/var/run/cdi"), metadata=_flag(
        "--cdi-dir", "where per-claim CDI specs are written", parse=_absolute))
    state_dir: Path = field(default=Path("/var/lib/tessera"), metadata=_flag(
        "--state-dir", "checkpoint and MPS directories", parse=_absolute))
    cdi_driver_root: Path | None = field(default=None, metadata=_flag(
        "--cdi-driver-root", "the host's NVIDIA driver root as this process sees it, mounted into containers "
        "through CDI", parse=_absolute))
    # the driver root's path on the host, when it differs
    cdi_host_driver_root: str | None = field(default=None, metadata=_flag(
        "--cdi-host-driver-root", "the same driver root as the host sees it, written into CDI specs "
        "(default: --cdi-driver-root; set it when the host's / is mounted elsewhere, e.g. /driver-root)",
        metavar="DIR"))
    mig_strategy: str = field(default="static", metadata=_flag(
        "--mig-strategy", "publish existing MIG instances (static), creatable ones (dynamic) or none",
        choices=MIG_STRATEGIES))
    # Node labels that choose this node's simulated profile / MIG strategy (kubeletplugin/nodelabels.py):
    # one DaemonSet over nodes of different kinds.
    simulate_label: str = field(default="", metadata=_flag(
        "--simulate-from-node-label", "simulated GPUs whose profile is the value of this label on the node "
        "(--simulate: the profile of nodes without it)", metavar="KEY"))
    mig_strategy_label: str = field(default="", metadata=_flag(
        "--mig-strategy-from-node-label", "where the node has this label, its value (none, static, dynamic) "
        "overrides --mig-strategy", metavar="KEY"))
    metrics_addr: str = field(default=":9400", metadata=_flag(
        "--metrics-addr", "serve /metrics and /healthz here", metavar="HOST:PORT"))
    # names this process's sockets; empty: the fixed names, for a plugin that never overlaps another
    instance_id: str = field(default="", metadata=_flag(
        "--instance-id", "unique per plugin process (in a DaemonSet: the pod UID); names this process's "
        "registration and DRA sockets so that an upgrade can start the new pod before the old one stops "
        "(default: fixed socket names)", metavar="ID"))
    # event class -> taint (driver.health)
    health_policy: HealthPolicy = field(default_factory=HealthPolicy, metadata=_flag(
        "--health-policy", 'GPU health policy as JSON: {"ignoredXids": [13, ...], "taints": {"<event class>": '
        '{"effect": "NoExecute", "clearsOnReset": true}}} (docs/health.md; default: the built-in policy)',
        metavar="JSON", parse=_health_policy))
    cleanup_on_exit: bool = field(default=False, metadata=_flag(
        "--cleanup-on-exit", "delete this node's ResourceSlices on SIGTERM (uninstall); by default they stay "
        "for the next start"))
    stop_grace: float = 10.0  # seconds the DRA server gives in-flight calls at shutdown
    socket_paths: SocketPaths = field(init=False)

    def __post_init__(self) -> None:
        # grpc comes with the socket code: keep it off the start of every `tessera` command (argparse is
        # built from this module), so that `tessera --help` needs no C++ runtime
        from kubeletplugin.grpcservers import SocketError, SocketPaths

        object.__setattr__(self, "socket_paths", SocketPaths(self.kubelet_dir, instance_id=self.instance_id))
        if not self.node_name:
            raise PluginConfigError("--node-name is required (in a DaemonSet: the downward API's spec.nodeName)")
        if (self.simulate or self.simulate_label) and self.nvml:
            raise PluginConfigError("--simulate (or --simulate-from-node-label) and --nvml exclude each other: "
                                    "pick one discovery backend")
        if self.mig_strategy not in MIG_STRATEGIES:
            raise PluginConfigError(
                f"--mig-strategy must be one of {', '.join(MIG_STRATEGIES)}, got {self.mig_strategy!r}"
            )
        try:
            parse_listen_address(self.metrics_addr)
        except ValueError as exc:
            raise PluginConfigError(str(exc)) from exc
        if self.cdi_host_driver_root is not None:
            if self.cdi_driver_root is None:
                raise PluginConfigError("--cdi-host-driver-root needs --cdi-driver-root (where this process sees it)")
            if not self.cdi_host_driver_root.startswith("/"):
                raise PluginConfigError(
                    f"--cdi-host-driver-root must be an absolute host path, got {self.cdi_host_driver_root!r}"
                )
        try:
            self.socket_paths.validate()
        except SocketError as exc:
            raise PluginConfigError(str(exc)) from exc
        if not (self.simulate or self.simulate_label or self.nvml):
            raise PluginConfigError(
                "no GPU backend: pass --nvml to publish the node's real GPUs, or --simulate PROFILE (or "
                "--simulate-from-node-label KEY) for simulated ones (a demo or test node); the agent never "
                "guesses, so a real node never publishes made-up GPUs"
            )

    @property
    def simulated(self) -> bool:
        return not self.nvml


def _flags() -> list[tuple[str, Flag, Any]]:
    """(field name, flag, default) of every field that is a flag, in declaration order."""
    out = []
    for f in fields(PluginConfig):
        flag = f.metadata.get("flag")
        if flag is None:
            continue
        default = f.default if f.default is not MISSING else None
        out.append((f.name, flag, default))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `tessera kubelet-plugin`, one per PluginConfig field that has a Flag."""
    backend = parser.add_mutually_exclusive_group()
    for name, flag, default in _flags():
        target = backend if flag.backend else parser
        shown = f" (default: {default})" if default not in (None, "", False) else ""
        kwargs: dict[str, Any] = {"dest": name, "help": flag.help + shown}
        if isinstance(default, bool):
            target.add_argument(flag.name, action="store_true", default=argparse.SUPPRESS, **kwargs)
            continue
        if flag.metavar:
            kwargs["metavar"] = flag.metavar
        if flag.choices:
            kwargs["choices"] = flag.choices
        if name == "node_name":
            kwargs["required"] = True
        # no argparse default: a flag left out keeps the dataclass field's default
        target.add_argument(flag.name, default=argparse.SUPPRESS, **kwargs)


def config_from_args(args: argparse.Namespace) -> PluginConfig:
    """The PluginConfig the parsed flags describe; PluginConfigError names the flag that cannot work."""
    values: dict[str, Any] = {}
    for name, flag, _ in _flags():
        if not hasattr(args, name):
            continue
        value = getattr(args, name)
        if flag.parse is not None and isinstance(value, str):
            try:
                value = flag.parse(value)
            except ValueError as exc:  # JSONDecodeError included
                text = str(exc)
                raise PluginConfigError(text if flag.name in text else f"{flag.name}: {text}") from exc
        values[name] = value
    return PluginConfig(**values)
