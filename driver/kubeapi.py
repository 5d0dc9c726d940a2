"""tessera's one Kubernetes client: the narrow slice of the API it uses, as plain dicts.

Objects are handled as the JSON the apiserver speaks (camelCase dicts), not as generated client
models: the DRA types change every release and a model that drops an unknown field would make
tessera silently lose data (e.g. `consumedCapacity`, or a pod's `extendedResourceClaimStatus`). Tests
replace `KubeAPI` with an in-memory fake.

Every command finds its cluster the way kubectl does, through the `kubernetes` package's loaders:
`--kubeconfig`, else $KUBECONFIG (a `:`-separated list is merged), else ~/.kube/config, else the
in-cluster service account (the node agent and the controller in their pods).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from driver import jsonstream
from driver.errors import TesseraError
from driver.gcpause import collector_paused

Obj = dict[str, Any]

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"
# DeviceTaintRule is served by the first of these that the cluster has switched on: v1 from Kubernetes 1.37,
# v1beta2 and v1alpha3 in 1.36 (both off by default)
TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
IN_CLUSTER = "the in-cluster service account (no kubeconfig found)"


class KubeConfigError(TesseraError):
    """The client configuration cannot be loaded; the message says from where."""


def kubeconfig_path(flag: str | None) -> str | None:
    """The kubeconfig kubectl would use; None when there is none (then the in-cluster config is tried)."""
    if flag:
        return flag
    env = os.environ.get("KUBECONFIG")
    if env:
        return env
    default = Path.home() / ".kube" / "config"
    return str(default) if default.exists() else None


@dataclass(frozen=True)
class ClientConfig:
    """A loaded configuration: the API client, the current context's namespace, and where it came from."""

    client: Any  # kubernetes.client.ApiClient
    namespace: str
    source: str


def _transport_retries() -> Any:
    """urllib3's retries for tessera's client: connection failures as before (3 tries), but a 429 comes back at
    once. urllib3's default slept out the apiserver's Retry-After up to three times inside the call; API Priority
    and Fairness raises that value to 32 s while it keeps dropping requests, so a node agent sat unseen and
    unstoppable in one call for up to 96 s. The caller now sees the 429 and its Retry-After (ApiError)."""
    from urllib3.util.retry import Retry

    return Retry(total=3, respect_retry_after_header=False, raise_on_status=False)


def load_client(kubeconfig: str | None = None) -> ClientConfig:
    """The client kubectl would build for `kubeconfig` (see the module's docstring); KubeConfigError if it
    cannot be loaded."""
    from kubernetes import client, config

    path = kubeconfig_path(kubeconfig)
    configuration = client.Configuration()
    configuration.retries = _transport_retries()
    try:
        if path:
            api_client = config.new_client_from_config(config_file=path, client_configuration=configuration)
            _, active = config.list_kube_config_contexts(config_file=path)
            namespace = str(((active or {}).get("context") or {}).get("namespace") or "default")
            return ClientConfig(api_client, namespace, path)
        config.load_incluster_config(client_configuration=configuration)
        return ClientConfig(client.ApiClient(configuration), "default", IN_CLUSTER)
    except Exception as exc:  # the loaders raise ConfigException, OSError, yaml and key errors alike
        raise KubeConfigError(f"cannot load the cluster configuration from {path or IN_CLUSTER}: {exc}") from exc


class ApiError(TesseraError):
    """An apiserver answer other than success; `status` is the HTTP code (0 when unreachable)."""

    reason = "apiserver"

    def __init__(self, status: int, http_reason: str, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {http_reason}: {message}" if message else f"{status} {http_reason}")
        self.status = status
        self.http_reason = http_reason  # the HTTP reason phrase ("Not Found"); `reason` is the metric label
        self.message = message
        # seconds the apiserver asked us to wait (its Retry-After header): API Priority and Fairness sends it
        # with every 429, and the request was not carried out, so it can be sent again after that long
        self.retry_after = retry_after

    @property
    def throttled(self) -> bool:
        """The apiserver refused the request unprocessed because it is busy (429 Too Many Requests)."""
        return self.status == 429

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
    def list_resource_slices(self, field_selector: str = "", label_selector: str = "",
                             not_older_than: str = "") -> Obj: ...
    def create_resource_slice(self, body: Obj) -> Obj: ...
    def replace_resource_slice(self, name: str, body: Obj) -> Obj: ...
    def delete_resource_slice(self, name: str) -> None: ...
    def watch_resource_slices(
        self, resource_version: str, field_selector: str = "", timeout_seconds: int = 60
    ) -> Iterator[WatchEvent]: ...


def retry_after_seconds(value: object) -> float | None:
    """A Retry-After header's delay in seconds; None when absent or not a number of seconds (the HTTP-date
    form is not used by kube-apiserver)."""
    try:
        seconds = float(str(value).strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds < 3600 else None


def _translate(exc: Exception) -> ApiError:
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        headers = exc.headers or {}
        return ApiError(int(exc.status or 0), str(exc.reason or ""), str(exc.body or "")[:500],
                        retry_after=retry_after_seconds(headers.get("Retry-After")))
    return ApiError(0, "Unreachable", str(exc))


class RealKubeAPI:
    """`KubeAPI` over the official client, talking JSON dicts. Raises KubeConfigError when no configuration
    can be loaded, ApiError for any failed call."""

    def __init__(self, kubeconfig: str | None = None, request_timeout: float = 10.0) -> None:
        from kubernetes import client

        loaded = load_client(kubeconfig)
        self.namespace = loaded.namespace  # the current context's, for commands run without -n
        self.source = loaded.source
        self._client = loaded.client
        self._custom = client.CustomObjectsApi(loaded.client)
        self._core_api: Any = None
        self._core_lock = threading.Lock()
        self._timeout = request_timeout

    @property
    def _core(self) -> Any:
        """kubernetes.client.CoreV1Api, imported on first use: the module takes 0.3 s to import, which the
        resource.k8s.io calls (all a node agent makes but its Node lookup) need not pay, and which `tessera
        status` pays in its pod-reading thread while the apiserver is still sending the slices."""
        with self._core_lock:
            if self._core_api is None:
                from kubernetes.client.api.core_v1_api import CoreV1Api

                self._core_api = CoreV1Api(self._client)
            return self._core_api

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            with collector_paused():  # the client decodes the answer inside the call: a list can be 100 MB
                return fn(*args, _request_timeout=self._timeout, **kwargs)
        except Exception as exc:  # the client raises urllib3 and ApiException alike
            raise _translate(exc) from exc

    def _json(self, fn: Any, *args: Any, **kwargs: Any) -> Obj:
        """A call's answer as the apiserver's JSON (the core API's generated models would drop newer fields),
        decoded while it arrives (driver.jsonstream): a list's items overlap with the apiserver still sending."""
        response = self._call(fn, *args, _preload_content=False, **kwargs)
        done = False
        try:
            with collector_paused():
                result = jsonstream.load(response.stream(jsonstream.READ_SIZE))
            done = True
        except ValueError as exc:  # not JSON, or not UTF-8
            raise ApiError(0, "BadResponse", f"the apiserver's answer is not JSON: {exc}") from exc
        except Exception as exc:  # the connection failed or timed out while the answer was read
            raise _translate(exc) from exc
        finally:
            if not done:
                response.close()  # a connection left half-way through an answer is not used again
            response.release_conn()
        if not isinstance(result, dict):
            raise ApiError(0, "BadResponse", f"the apiserver's answer is not an object but {type(result).__name__}")
        return result

    def get_node(self, name: str) -> Obj:
        return self._json(self._core.read_node, name)

    def get_resource_claim(self, namespace: str, name: str) -> Obj:
        result: Obj = self._call(
            self._custom.get_namespaced_custom_object,
            RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaims", name,
        )
        return result

    def list_resource_slices(self, field_selector: str = "", label_selector: str = "",
                             not_older_than: str = "") -> Obj:
        """The slices; with `not_older_than` (a resourceVersion, "0" for any) the apiserver answers from its
        watch cache once that has caught up. Without it the list is a consistent read, which at 1,000 nodes
        the apiserver passed to etcd as a range over every slice of the cluster: a thousand node agents
        listing at once took etcd to 14 GiB in 30 s."""
        version = {"resource_version": not_older_than, "resource_version_match": "NotOlderThan"} \
            if not_older_than else {}
        return self._json(
            self._custom.list_cluster_custom_object,
            RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices",
            field_selector=field_selector or None, label_selector=label_selector or None, **version,
        )

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
        return self._json(self._custom.list_cluster_custom_object, RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses")

    def watch_device_classes(self, resource_version: str, timeout_seconds: int = 60) -> Iterator[WatchEvent]:
        return self._watch_cluster("deviceclasses", resource_version, timeout_seconds)

    def list_resource_claims(self) -> Obj:
        """ResourceClaims of every namespace (the cluster-wide list endpoint)."""
        return self._json(self._custom.list_cluster_custom_object, RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims")

    def watch_resource_claims(self, resource_version: str, timeout_seconds: int = 60) -> Iterator[WatchEvent]:
        return self._watch_cluster("resourceclaims", resource_version, timeout_seconds)

    # -- what `tessera explain`, `status` and `check` read ----------------------------------------------
    def list_resource_claim_templates(self, namespace: str) -> Obj:
        result: Obj = self._call(self._custom.list_namespaced_custom_object, RESOURCE_GROUP, RESOURCE_VERSION,
                                 namespace, "resourceclaimtemplates")
        return result

    def list_pods(self, namespace: str | None = None) -> Obj:
        """Pods of one namespace, or of all."""
        if namespace:
            return self._json(self._core.list_namespaced_pod, namespace)
        return self._json(self._core.list_pod_for_all_namespaces)

    def list_nodes(self) -> Obj:
        return self._json(self._core.list_node)

    def list_events(self, namespace: str, field_selector: str = "") -> Obj:
        return self._json(self._core.list_namespaced_event, namespace, field_selector=field_selector or None)

    def list_device_taint_rules(self) -> Obj | None:
        """DeviceTaintRules from the first version the cluster serves (TAINT_RULE_VERSIONS); None when it
        serves none (the DRADeviceTaintRules gate and its API are off, as by default in 1.36)."""
        for version in TAINT_RULE_VERSIONS:
            try:
                result: Obj = self._call(self._custom.list_cluster_custom_object, RESOURCE_GROUP, version,
                                         "devicetaintrules")
            except ApiError as exc:
                if exc.not_found:
                    continue
                raise
            return result
        return None

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
