"""A small JSON client for the e2e apiserver: objects as dicts, the admin token, the cluster's CA only."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ADMIN_TOKEN = "tessera-e2e-admin-token"
Obj = dict[str, Any]


class KubeError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status = status
        self.body = body
        try:
            self.message = str(json.loads(body).get("message", body))
        except (ValueError, AttributeError):
            self.message = body
        super().__init__(f"{method} {path}: {status}: {self.message}")


# kind -> (api prefix, plural, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "Event": ("/api/v1", "events", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Secret": ("/api/v1", "secrets", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Service": ("/api/v1", "services", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "ReplicaSet": ("/apis/apps/v1", "replicasets", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "StatefulSet": ("/apis/apps/v1", "statefulsets", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices", True),
    "DeviceClass": ("/apis/resource.k8s.io/v1", "deviceclasses", False),
    "ResourceSlice": ("/apis/resource.k8s.io/v1", "resourceslices", False),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    "ValidatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", False),
    "MutatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", False),
}


def resource_path(kind: str, name: str = "", namespace: str = "") -> str:
    try:
        prefix, plural, namespaced = RESOURCES[kind]
    except KeyError:
        raise ValueError(f"e2e.cluster knows no resource path for kind {kind!r}; add it to RESOURCES") from None
    path = prefix
    if namespaced and namespace:
        path += f"/namespaces/{namespace}"
    path += f"/{plural}"
    if name:
        path += f"/{name}"
    return path


class Kube:
    """JSON over HTTPS with the admin token: just what the tests need, objects as dicts."""

    def __init__(self, server: str, ca_file: Path, token: str = ADMIN_TOKEN) -> None:
        self.server = server
        self.token = token
        # Only the cluster's CA: CA-bundle and proxy variables of the environment must not apply.
        self.ssl = ssl.create_default_context(cafile=str(ca_file))
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                                   urllib.request.HTTPSHandler(context=self.ssl))
        # `Warning:` headers of the last response (admission webhooks' warnings arrive this way).
        self.last_warnings: list[str] = []

    def request(self, method: str, path: str, body: Obj | None = None, *, params: dict[str, str] | None = None,
                content_type: str = "application/json", timeout: float = 30.0) -> Obj:
        url = self.server + path + (f"?{urllib.parse.urlencode(params)}" if params else "")
        req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {self.token}", "Content-Type": content_type,
                                              "Accept": "application/json"})
        try:
            with self._opener.open(req, timeout=timeout) as resp:
                status, headers, data = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as exc:
            status, headers, data = exc.code, exc.headers, exc.read()
        self.last_warnings = [w.strip() for w in headers.get_all("Warning") or []]
        if status >= 400:
            raise KubeError(status, method, path, data.decode(errors="replace"))
        if not data:
            return {}
        result: Obj = json.loads(data)
        return result

    def healthy(self, endpoint: str = "/readyz") -> bool:
        """True when a health endpoint answers 200 ("ok" in plain text, not JSON)."""
        req = urllib.request.Request(self.server + endpoint, headers={"Authorization": f"Bearer {self.token}"})
        try:
            with self._opener.open(req, timeout=5) as resp:
                ok: bool = resp.status == 200
                return ok
        except urllib.error.HTTPError:
            return False

    def get(self, kind: str, name: str, namespace: str = "") -> Obj:
        return self.request("GET", resource_path(kind, name, namespace))

    def get_or_none(self, kind: str, name: str, namespace: str = "") -> Obj | None:
        try:
            return self.get(kind, name, namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str = "", *, field_selector: str = "", label_selector: str = "") -> list[Obj]:
        params = {}
        if field_selector:
            params["fieldSelector"] = field_selector
        if label_selector:
            params["labelSelector"] = label_selector
        items: list[Obj] = self.request("GET", resource_path(kind, "", namespace), params=params)["items"]
        return items

    def create(self, obj: Obj, *, dry_run: bool = False) -> Obj:
        meta = obj.get("metadata", {})
        params = {"dryRun": "All"} if dry_run else None
        return self.request("POST", resource_path(obj["kind"], "", meta.get("namespace", "")), obj, params=params)

    def apply(self, obj: Obj) -> Obj:
        """Create, or replace an existing object of the same name (keeping its resourceVersion)."""
        meta = obj["metadata"]
        try:
            return self.create(obj)
        except KubeError as exc:
            if exc.status != 409:
                raise
        current = self.get(obj["kind"], meta["name"], meta.get("namespace", ""))
        obj = {**obj, "metadata": {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}}
        return self.request("PUT", resource_path(obj["kind"], meta["name"], meta.get("namespace", "")), obj)

    def delete(self, kind: str, name: str, namespace: str = "", *, grace_seconds: int | None = None) -> None:
        body = {"gracePeriodSeconds": grace_seconds} if grace_seconds is not None else None
        try:
            self.request("DELETE", resource_path(kind, name, namespace), body)
        except KubeError as exc:
            if exc.status != 404:
                raise

    def patch_status(self, kind: str, name: str, patch: Obj, namespace: str = "") -> Obj:
        return self.request("PATCH", resource_path(kind, name, namespace) + "/status", patch,
                            content_type="application/merge-patch+json")


def load_manifests(path: Path) -> list[Obj]:
    """Every object in a YAML file or in the YAML files of a directory (sorted, not recursive)."""
    files = sorted(p for p in path.iterdir() if p.suffix in {".yaml", ".yml"}) if path.is_dir() else [path]
    return [doc for f in files for doc in yaml.safe_load_all(f.read_text()) if doc]
