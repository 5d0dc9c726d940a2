"""The narrow slice of the Kubernetes API tessera uses, as plain dicts.

Objects are handled as the JSON the apiserver speaks (camelCase dicts), not as generated client
models: the DRA types change every release and a model that drops an unknown field would make
tessera silently lose data (e.g. `consumedCapacity`). Tests replace `KubeAPI` with an in-memory fake.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from driver.errors import TesseraError

Obj = dict[str, Any]

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"


class ApiError(TesseraError):
    """An apiserver answer other than success; `status` is the HTTP code (0 when unreachable)."""

    reason = "apiserver"

    def __init__(self, status: int, http_reason: str, message: str = "") -> None:
        super().__init__(f"{status} {http_reason}: {message}" if message else f"{status} {http_reason}")
        self.status = status
        self.http_reason = http_reason  # the HTTP reason phrase ("Not Found"); `reason` is the metric label
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def retryable(self) -> bool:
        return self.status in {0, 429} or self.status >= 500


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
    object: Obj


class KubeAPI(Protocol):
    def get_node(self, name: str) -> Obj: ...
    def get_resource_claim(self, namespace: str, name: str) -> Obj: ...
    def list_resource_slices(self, field_selector: str = "", label_selector: str = "") -> Obj: ...
    def create_resource_slice(self, body: Obj) -> Obj: ...
    def replace_resource_slice(self, name: str, body: Obj) -> Obj: ...
    def delete_resource_slice(self, name: str) -> None: ...
    def watch_resource_slices(
        self, resource_version: str, field_selector: str = "", timeout_seconds: int = 60
    ) -> Iterator[WatchEvent]: ...


def _translate(exc: Exception) -> ApiError:
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        return ApiError(int(exc.status or 0), str(exc.reason or ""), str(exc.body or "")[:500])
    return ApiError(0, "Unreachable", str(exc))


class RealKubeAPI:
    """`KubeAPI` over the official client, talking JSON dicts through CustomObjectsApi."""

    def __init__(self, kubeconfig: str | None = None, request_timeout: float = 10.0) -> None:
        from kubernetes import client, config

        if kubeconfig:
            api_client = config.new_client_from_config(config_file=kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self._client = api_client
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._timeout = request_timeout

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=self._timeout, **kwargs)
        except Exception as exc:  # the client raises urllib3 and ApiException alike
            raise _translate(exc) from exc

    def get_node(self, name: str) -> Obj:
        node = self._call(self._core.read_node, name)
        result: Obj = self._client.sanitize_for_serialization(node)
        return result

    def get_resource_claim(self, namespace: str, name: str) -> Obj:
        result: Obj = self._call(
            self._custom.get_namespaced_custom_object,
            RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaims", name,
        )
        return result

    def list_resource_slices(self, field_selector: str = "", label_selector: str = "") -> Obj:
        result: Obj = self._call(
            self._custom.list_cluster_custom_object,
            RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices",
            field_selector=field_selector or None, label_selector=label_selector or None,
        )
        return result

    def create_resource_slice(self, body: Obj) -> Obj:
        result: Obj = self._call(
            self._custom.create_cluster_custom_object, RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices", body
        )
        return result

    def replace_resource_slice(self, name: str, body: Obj) -> Obj:
        result: Obj = self._call(
            self._custom.replace_cluster_custom_object,
            RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices", name, body,
        )
        return result

    def delete_resource_slice(self, name: str) -> None:
        self._call(
            self._custom.delete_cluster_custom_object, RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices", name
        )

    def watch_resource_slices(
        self, resource_version: str, field_selector: str = "", timeout_seconds: int = 60
    ) -> Iterator[WatchEvent]:
        from kubernetes import watch

        w = watch.Watch()
        try:
            for event in w.stream(
                self._custom.list_cluster_custom_object,
                RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices",
                resource_version=resource_version, field_selector=field_selector or None,
                timeout_seconds=timeout_seconds, allow_watch_bookmarks=True,
            ):
                yield WatchEvent(str(event["type"]), event["object"])
        except Exception as exc:
            raise _translate(exc) from exc
        finally:
            w.stop()

    # -- added for the controller (WEBHOOK): list/watch of deviceclasses and all resourceclaims ------------
    def list_device_classes(self) -> Obj:
        result: Obj = self._call(
            self._custom.list_cluster_custom_object, RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses"
        )
        return result

    def watch_device_classes(self, resource_version: str, timeout_seconds: int = 60) -> Iterator[WatchEvent]:
        return self._watch_cluster("deviceclasses", resource_version, timeout_seconds)

    def list_resource_claims(self) -> Obj:
        """ResourceClaims of every namespace (the cluster-wide list endpoint)."""
        result: Obj = self._call(
            self._custom.list_cluster_custom_object, RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims"
        )
        return result

    def watch_resource_claims(self, resource_version: str, timeout_seconds: int = 60) -> Iterator[WatchEvent]:
        return self._watch_cluster("resourceclaims", resource_version, timeout_seconds)

    def _watch_cluster(self, plural: str, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        from kubernetes import watch

        w = watch.Watch()
        try:
            for event in w.stream(
                self._custom.list_cluster_custom_object,
                RESOURCE_GROUP, RESOURCE_VERSION, plural,
                resource_version=resource_version, timeout_seconds=timeout_seconds, allow_watch_bookmarks=True,
            ):
                yield WatchEvent(str(event["type"]), event["object"])
        except Exception as exc:
            raise _translate(exc) from exc
        finally:
            w.stop()
