"""`tessera controller` as a real process: it serves HTTPS while the apiserver is unreachable (the
cache keeps retrying) and exits cleanly on SIGTERM."""

from __future__ import annotations

import http.client
import signal
import socket
import ssl
import subprocess
import sys
import threading

import pytest

from tests.builders.webhook import CA

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: not-a-real-token}
contexts:
- name: c
  context: {cluster: nowhere, user: u}
current-context: c
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def controller(tmp_path, *extra: str) -> subprocess.Popen[str]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    return subprocess.Popen(
        [sys.executable, "-m", "tessera", "--log-format", "json", "controller", "--kubeconfig", str(kubeconfig),
         *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def healthz(port: int, ca: CA) -> int | None:
    try:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=2,
                                           context=ssl.create_default_context(cadata=ca.pem().decode()))
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    except OSError:
        return None


def test_controller_serves_and_stops_on_sigterm(tmp_path):
    ca = CA()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)
    port = free_port()
    proc = controller(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key), "--listen", f"127.0.0.1:{port}",
                      "--metrics-addr", f"127.0.0.1:{free_port()}")
    try:
        pause = threading.Event()
        for _ in range(300):
            if healthz(port, ca) == 200 or proc.poll() is not None:
                break
            pause.wait(0.1)
        assert healthz(port, ca) == 200, proc.stderr.read() if proc.poll() is not None else "not serving"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert '"event": "shutting down"' in err and '"signal": "SIGTERM"' in err
    assert '"event": "controller stopped"' in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tls-cert", "/nonexistent/tls.crt", "--tls-key", "/nonexistent/tls.key"], "cannot start the webhook"),
        (["--tls-cert", "x", "--tls-key", "y", "--listen", "nowhere:port"], "is not HOST:PORT"),
        (["--tls-cert", "x", "--tls-key", "y", "--probe-addr", "nowhere:port"], "is not HOST:PORT"),
        (["--tls-cert", "x", "--tls-key", "y", "--max-reviews-per-client", "0"],
         "--max-reviews-per-client must be at least 1"),
    ],
)
def test_controller_refuses_to_start_with_a_clear_error(tmp_path, args, message):
    proc = controller(tmp_path, *args)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (1, 2)
    assert message in err


def test_controller_with_an_unreadable_kubeconfig_exits_1(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "tessera", "--log-format", "json", "controller", "--kubeconfig",
         str(tmp_path / "missing"), "--tls-cert", "x", "--tls-key", "y"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "cannot load the Kubernetes client configuration" in err


def test_probes_on_their_own_port_and_a_missing_client_ca_is_named(tmp_path):
    ca = CA()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)
    proc = controller(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key), "--client-ca",
                      str(tmp_path / "missing-ca.crt"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "cannot start the webhook" in err and "missing-ca.crt" in err

    port, probe_port = free_port(), free_port()
    proc = controller(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key), "--listen", f"127.0.0.1:{port}",
                      "--metrics-addr", "", "--probe-addr", f"127.0.0.1:{probe_port}")
    try:
        pause = threading.Event()
        status = None
        for _ in range(300):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", probe_port, timeout=2)
                conn.request("GET", "/healthz")
                status = conn.getresponse().status
                break
            except OSError:
                if proc.poll() is not None:
                    break
                pause.wait(0.1)
        assert status == 200, proc.stderr.read() if proc.poll() is not None else "not serving"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
