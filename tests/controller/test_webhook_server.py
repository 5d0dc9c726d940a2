"""The HTTPS webhook server on a real socket: AdmissionReview round trips, TLS 1.2+, certificate
reload, the 3 MiB limit, health endpoints, the probe port and client certificates. Certificates are
generated per test with `cryptography`."""

from __future__ import annotations

import http.client
import json
import socket
import ssl

import pytest
from cryptography import x509

from controller.admission import AdmissionHandler
from controller.checks.inputs import CheckContext
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from controller.webhook import MAX_BODY_BYTES, CertificateStore, WebhookServer
from tests.builders.webhook import CA, admission_review, client_context, connect, issue_client, post
from tests.fakes.cluster import device_class


@pytest.fixture
def ca() -> CA:
    return CA()


@pytest.fixture
def tls_files(tmp_path, ca):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)
    return cert, key


@pytest.fixture
def observed():
    return []


@pytest.fixture
def server(tls_files, observed):
    ready = {"value": True}

    def context() -> CheckContext:
        return CheckContext(schema=published_schema(), samples=sample_index())

    srv = WebhookServer(
        AdmissionHandler(context),
        CertificateStore(str(tls_files[0]), str(tls_files[1])),
        "127.0.0.1",
        0,
        observe=lambda *args: observed.append(args),
        ready=lambda: ready["value"],
    )
    srv.ready_flag = ready
    srv.start()
    yield srv
    srv.stop()


D = 'device.attributes["gpu.tessera.dev"]'


def test_admission_review_round_trip_over_https(server, ca, observed):
    good = device_class("gpu.tessera.dev", f'{D}.type == "gpu"')
    status, body = post(connect(server, ca), "/validate-deviceclass?timeout=10s",
                        json.dumps(admission_review(good)).encode())
    assert status == 200
    answer = json.loads(body)
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"] == {"uid": "6a1c1f8e-0000-4000-8000-00000000beef", "allowed": True}
    assert observed[-1][:3] == ("/validate-deviceclass", "DeviceClass", "allowed")


def test_rejection_travels_back_with_its_message(server, ca, observed):
    bad = device_class("bad.gpu.tessera.dev", f'{D}.uuid == "x"')
    status, body = post(connect(server, ca), "/validate-deviceclass", json.dumps(admission_review(bad)).encode())
    assert status == 200
    response = json.loads(body)["response"]
    assert response["allowed"] is False
    assert 'reads "uuid"' in response["status"]["message"]
    assert observed[-1][2] == "denied"


def test_several_reviews_on_one_keep_alive_connection(server, ca):
    conn = connect(server, ca)
    review = json.dumps(admission_review(device_class("gpu.tessera.dev", "true"))).encode()
    assert post(conn, "/validate-deviceclass", review)[0] == 200
    assert post(conn, "/validate-deviceclass", review)[0] == 200


def test_health_and_readiness(server, ca):
    conn = connect(server, ca)
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    assert (response.status, response.read()) == (200, b"ok\n")
    conn.request("GET", "/readyz")
    response = conn.getresponse()
    assert (response.status, response.read()) == (200, b"ok\n")
    server.ready_flag["value"] = False
    conn.request("GET", "/readyz")
    response = conn.getresponse()
    assert (response.status, response.read()) == (503, b"inventory not synced\n")


def test_body_over_three_mebibytes_is_refused_without_reading_it(server, ca, observed):
    conn = connect(server, ca)
    conn.putrequest("POST", "/validate-resourceclaim")
    conn.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413
    assert b"3145728-byte limit" in response.read()
    assert observed[-1][2] == "too-large"


def test_body_of_exactly_the_limit_is_read(server, ca):
    review = json.dumps(admission_review(device_class("gpu.tessera.dev", "true")))
    padded = review + " " * (MAX_BODY_BYTES - len(review))
    status, _ = post(connect(server, ca), "/validate-deviceclass", padded.encode())
    assert status == 200


def test_malformed_json_is_a_bad_request(server, ca, observed):
    status, body = post(connect(server, ca), "/validate-deviceclass", b"{not json")
    assert status == 400
    assert body.startswith(b"bad AdmissionReview:")
    assert observed[-1][2] == "bad-request"


def test_not_an_admission_review_is_a_bad_request(server, ca):
    status, body = post(connect(server, ca), "/mutate-resourceclaim", b'{"kind": "Pod"}')
    assert status == 400
    assert b"expected apiVersion admission.k8s.io/v1" in body


def test_unknown_path_is_not_found(server, ca):
    status, _ = post(connect(server, ca), "/validate-pods", b"{}")
    assert status == 404
    conn = connect(server, ca)
    conn.request("GET", "/metrics")
    assert conn.getresponse().status == 404


def test_missing_content_length_is_refused(server, ca):
    conn = connect(server, ca)
    conn.putrequest("POST", "/validate-deviceclass")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    assert conn.getresponse().status == 411


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_tls_below_1_2_is_refused(server, ca):
    conn = connect(server, ca, minimum_version=ssl.TLSVersion.MINIMUM_SUPPORTED,
                   maximum_version=ssl.TLSVersion.TLSv1_1)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        conn.request("GET", "/healthz")
        conn.getresponse()


def test_tls_1_2_is_accepted(server, ca):
    conn = connect(server, ca, maximum_version=ssl.TLSVersion.TLSv1_2)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200


def served_serial(server: WebhookServer, ca: CA) -> int:
    conn = connect(server, ca)
    conn.request("GET", "/healthz")
    conn.getresponse().read()
    der = conn.sock.getpeercert(binary_form=True)
    conn.close()
    return x509.load_der_x509_certificate(der).serial_number


def test_rotated_certificate_is_served_on_the_next_connection(server, ca, tls_files):
    first = served_serial(server, ca)
    rotated = ca.issue(*tls_files, common_name="tessera-webhook-rotated")
    assert rotated != first
    assert served_serial(server, ca) == rotated
    assert server.certs.reloads == 1


def test_broken_replacement_keeps_the_previous_certificate(server, ca, tls_files):
    first = served_serial(server, ca)
    tls_files[0].write_text("-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n")
    assert served_serial(server, ca) == first
    assert server.certs.reloads == 0


def test_unloadable_first_certificate_is_an_error(tmp_path):
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("nope")
    key.write_text("nope")
    with pytest.raises(ssl.SSLError):
        CertificateStore(str(cert), str(key))
    with pytest.raises(FileNotFoundError):
        CertificateStore(str(tmp_path / "missing.pem"), str(key))


def test_handler_failure_is_a_500_and_counted(tls_files, ca, observed):
    def broken_context() -> CheckContext:
        raise RuntimeError("boom")

    srv = WebhookServer(AdmissionHandler(broken_context), CertificateStore(str(tls_files[0]), str(tls_files[1])),
                        "127.0.0.1", 0, observe=lambda *args: observed.append(args))
    srv.start()
    try:
        review = json.dumps(admission_review(device_class("gpu.tessera.dev", "true"))).encode()
        status, body = post(connect(srv, ca), "/validate-deviceclass", review)
    finally:
        srv.stop()
    assert (status, body) == (500, b"internal error\n")
    assert observed[-1][2] == "error"


def test_deleted_certificate_files_keep_the_loaded_pair(server, ca, tls_files):
    first = served_serial(server, ca)
    tls_files[0].unlink()
    tls_files[1].unlink()
    assert served_serial(server, ca) == first


# -- the probe port ---------------------------------------------------------------------------------------


def test_probe_port_serves_health_and_readiness_over_plain_http(tls_files):
    ready = {"value": True}
    srv = WebhookServer(AdmissionHandler(lambda: CheckContext(schema=published_schema(), samples=sample_index())),
                        CertificateStore(str(tls_files[0]), str(tls_files[1])), "127.0.0.1", 0,
                        ready=lambda: ready["value"], probe=("127.0.0.1", 0))
    srv.start()
    try:
        assert srv.probe_port not in (None, srv.port)

        def get(path: str, method: str = "GET") -> tuple[int, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", srv.probe_port, timeout=5)
            conn.request(method, path)
            response = conn.getresponse()
            return response.status, response.read()

        assert get("/healthz") == (200, b"ok\n")
        assert get("/readyz") == (200, b"ok\n")
        ready["value"] = False
        assert get("/readyz") == (503, b"inventory not synced\n")
        status, body = get("/validate-deviceclass", "POST")  # reviews never travel this port
        assert status == 404 and b"GET /healthz and /readyz" in body
    finally:
        srv.stop()


def test_a_probe_port_in_use_is_an_error_before_start(tls_files):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            WebhookServer(AdmissionHandler(lambda: CheckContext(schema=published_schema(), samples=sample_index())),
                          CertificateStore(str(tls_files[0]), str(tls_files[1])), "127.0.0.1", 0,
                          probe=("127.0.0.1", taken.getsockname()[1]))


# -- client certificates ------------------------------------------------------------------------------------


@pytest.fixture
def authenticated(tmp_path, tls_files, ca):
    """A server that requires a client certificate signed by `apiserver_ca` (not the serving CA)."""
    apiserver_ca = CA()
    ca_file = tmp_path / "client-ca.crt"
    ca_file.write_bytes(apiserver_ca.pem())
    srv = WebhookServer(AdmissionHandler(lambda: CheckContext(schema=published_schema(), samples=sample_index())),
                        CertificateStore(str(tls_files[0]), str(tls_files[1]), str(ca_file)), "127.0.0.1", 0,
                        probe=("127.0.0.1", 0))
    srv.start()
    yield srv, apiserver_ca
    srv.stop()


def review_with(server: WebhookServer, ca: CA, client: tuple | None) -> int:
    context = client_context(ca)
    if client is not None:
        context.load_cert_chain(*client)
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=5)
    status, _ = post(conn, "/validate-deviceclass", json.dumps(admission_review(device_class("x", "true"))).encode())
    return status


def test_a_caller_without_a_client_certificate_is_refused(authenticated, ca):
    server, _ = authenticated
    with pytest.raises((ssl.SSLError, ConnectionError)):
        review_with(server, ca, None)


def test_a_client_certificate_from_another_ca_is_refused(authenticated, ca, tmp_path):
    server, _ = authenticated
    cert, key = tmp_path / "other.crt", tmp_path / "other.key"
    issue_client(CA(), cert, key)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        review_with(server, ca, (cert, key))


def test_the_apiservers_client_certificate_is_reviewed_and_probes_need_none(authenticated, ca, tmp_path):
    server, apiserver_ca = authenticated
    cert, key = tmp_path / "apiserver.crt", tmp_path / "apiserver.key"
    issue_client(apiserver_ca, cert, key)
    assert review_with(server, ca, (cert, key)) == 200
    conn = http.client.HTTPConnection("127.0.0.1", server.probe_port, timeout=5)
    conn.request("GET", "/readyz")
    assert conn.getresponse().status == 200


def test_a_client_ca_file_without_a_certificate_is_an_error_naming_it(tls_files, tmp_path):
    bad = tmp_path / "client-ca.crt"
    bad.write_text("not a certificate\n")
    with pytest.raises(ssl.SSLError, match=r"client-ca\.crt holds no PEM CA certificate"):
        CertificateStore(str(tls_files[0]), str(tls_files[1]), str(bad))
    with pytest.raises(FileNotFoundError):
        CertificateStore(str(tls_files[0]), str(tls_files[1]), str(tmp_path / "missing.crt"))
