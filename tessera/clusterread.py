"""Read what `tessera explain` and `tessera status` need from the apiserver, the way kubectl finds it.

The kubeconfig is `--kubeconfig`, else $KUBECONFIG (a `:`-separated list is merged), else
~/.kube/config, else the in-cluster service account; the namespace is `-n`, else the current
context's, else `default`. Everything is read once, as plain JSON; nodes and other namespaces' pods
are optional (a user without the right to list them still gets an answer, with a note).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from driver import DRIVER_NAME
from driver.errors import TesseraError

Obj = dict[str, Any]
GROUP, VERSION = "resource.k8s.io", "v1"


class ReadError(TesseraError):
    """The cluster cannot be reached or refuses a read tessera needs; the message says which."""


def kubeconfig_path(flag: str | None) -> str | None:
    """The kubeconfig kubectl would use; None when there is none (then the in-cluster config is tried)."""
    if flag:
        return flag
    env = os.environ.get("KUBECONFIG")
    if env:
        return env
    default = Path.home() / ".kube" / "config"
    return str(default) if default.exists() else None


class ClusterReader:
    """Lists over one API client; every method returns JSON objects as the apiserver sent them."""

    def __init__(self, kubeconfig: str | None = None, *, timeout: float = 30.0) -> None:
        from kubernetes import client, config

        self.path = kubeconfig_path(kubeconfig)
        self.context_namespace = "default"
        try:
            if self.path:
                api_client = config.new_client_from_config(config_file=self.path)
                _, active = config.list_kube_config_contexts(config_file=self.path)
                self.context_namespace = str(((active or {}).get("context") or {}).get("namespace") or "default")
            else:
                config.load_incluster_config()
                api_client = client.ApiClient()
        except Exception as exc:  # the loaders raise ConfigException, OSError, yaml and key errors alike
            where = self.path or "the in-cluster service account (no kubeconfig found)"
            raise ReadError(f"cannot load the cluster configuration from {where}: {exc}") from exc
        self._client = api_client
        self._timeout = timeout

    def _call(self, what: str, fn: Any, *args: Any, optional: bool = False, **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=self._timeout, **kwargs)
        except Exception as exc:  # ApiException for HTTP errors, urllib3 errors for the connection
            status = getattr(exc, "status", None)
            if optional and status in (401, 403, 404):
                return None
            reason = f"{status} {getattr(exc, 'reason', '') or ''}".strip() if status else str(exc)
            raise ReadError(f"cannot read {what}: {reason}") from exc

    def _custom(self, plural: str, what: str, namespace: str = "", *, optional: bool = False,
                **kwargs: Any) -> list[Obj] | None:
        from kubernetes import client

        api = client.CustomObjectsApi(self._client)
        if namespace:
            listing = self._call(what, api.list_namespaced_custom_object, GROUP, VERSION, namespace, plural,
                                 optional=optional, **kwargs)
        else:
            listing = self._call(what, api.list_cluster_custom_object, GROUP, VERSION, plural, optional=optional,
                                 **kwargs)
        return None if listing is None else [i for i in listing.get("items") or () if isinstance(i, dict)]

    def _core(self, what: str, method: str, *args: Any, optional: bool = False) -> list[Obj] | None:
        from kubernetes import client

        listing = self._call(what, getattr(client.CoreV1Api(self._client), method), *args, optional=optional)
        if listing is None:
            return None
        items: list[Obj] = self._client.sanitize_for_serialization(listing).get("items") or []
        return items

    def resource_slices(self) -> list[Obj]:
        return self._custom("resourceslices", "resourceslices", field_selector=f"spec.driver={DRIVER_NAME}") or []

    def device_classes(self) -> dict[str, Obj]:
        items = self._custom("deviceclasses", "deviceclasses") or []
        return {str((c.get("metadata") or {}).get("name")): c for c in items}

    def resource_claims(self) -> list[Obj]:
        """Every namespace's claims: allocations anywhere hold devices."""
        return self._custom("resourceclaims", "resourceclaims in all namespaces") or []

    def templates(self, namespace: str) -> list[Obj]:
        return self._custom("resourceclaimtemplates", "resourceclaimtemplates", namespace, optional=True) or []

    def pods(self, namespace: str | None = None) -> list[Obj] | None:
        """Pods of one namespace, or of all (None when not allowed)."""
        if namespace:
            return self._core(f"pods in {namespace}", "list_namespaced_pod", namespace, optional=True)
        return self._core("pods in all namespaces", "list_pod_for_all_namespaces", optional=True)

    def nodes(self) -> list[Obj] | None:
        return self._core("nodes", "list_node", optional=True)
