"""The backend's POSTs and owner GETs through urllib3's API on the client's own pool
(`KubernetesBackend._send`): the request as the client's REST layer would send it (path
prefix, headers, credentials), errors as the generated client raises them, a broken answer
or a silent server an error of the transport that `call` retries, connections kept,
replaced when the server closed them, over TLS, and the REST layer as before through an
HTTP proxy."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import socket
import ssl
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest
import urllib3
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException

from clusters.backends import BackendUnreachable
from clusters.backends.kubernetes import KubernetesBackend, _retry_after
from clusters.backends.kubernetes.errors import said
from tests.clusters.fake_apiserver import kubeconfig_for

pytestmark = pytest.mark.timeout(30)
EVENT = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}}


HANG_UP = b""


def _to_the_close(answer: bytes) -> bool:
    head = answer.split(b"\r\n\r\n", 1)[0]
    return not any(word in head for word in (b"Content-Length", b"chunked", b" 204 ", b" 100 "))


def ok(body: bytes = b'{"kind":"Status","code":201}', *, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class Canned:
    """A server on loopback that answers each request with the next canned answer (None:
    close the connection without one; HANG_UP after an answer: close the connection then,
    as an idle timeout does) and keeps what it was sent. It closes the connection after
    an answer that says so or runs to the close, and after each with `close_after`."""

    def __init__(
        self,
        answers: list[bytes | None],
        *,
        tls: ssl.SSLContext | None = None,
        close_after: bool = False,
    ):
        self.answers = list(answers)
        self.close_after = close_after
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.tls = tls
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        while self.answers:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError):  # a client that does not trust it
                    conn.close()
                    continue
            with conn:
                self._answer(conn.makefile("rb"), conn)

    def _answer(self, reader, conn) -> None:
        while self.answers:
            line = reader.readline()
            if not line:
                return
            headers = {}
            while (header := reader.readline()) not in (b"\r\n", b""):
                name, _, value = header.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            body = reader.read(int(headers.get("content-length", 0)))
            self.requests.append((line.decode().strip(), headers, body))
            answer = self.answers.pop(0)
            if answer is None:
                return  # closed, unanswered
            conn.sendall(answer)
            if self.answers and self.answers[0] == HANG_UP:
                self.answers.pop(0)
                return
            if self.close_after or b"Connection: close" in answer or _to_the_close(answer):
                return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def canned():
    servers: list[Canned] = []

    def make(answers, **kwargs) -> Canned:
        servers.append(Canned(answers, **kwargs))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def backend_for(url: str, **config) -> KubernetesBackend:
    cluster = SimpleNamespace(pk=None, name="c", config={"backoff_s": 0.01, **config})
    return KubernetesBackend(cluster, kubeconfig=kubeconfig_for(url))


def connections(backend: KubernetesBackend) -> int:
    return backend.direct.num_connections


def test_the_request_is_the_rest_layers_with_the_servers_path_prefix(canned):
    server = canned([ok()])
    backend = backend_for(server.url + "/k8s/clusters/c-1")
    backend.post({"metadata": {"name": "p/1"}}, "namespaces", "ns", "pods", "p/1", "binding")
    ((line, headers, body),) = server.requests
    assert line == "POST /k8s/clusters/c-1/api/v1/namespaces/ns/pods/p%2F1/binding HTTP/1.1"
    assert headers["host"] == server.url.removeprefix("http://")
    assert headers["authorization"] == "Bearer fake-token"
    assert headers["content-type"] == headers["accept"] == "application/json"
    assert headers["user-agent"].startswith("OpenAPI-Generator/")
    assert json.loads(body) == {"metadata": {"name": "p/1"}}
    assert backend.requests == 1 and backend.bytes_read > 0


def test_a_refusal_is_the_generated_clients_api_exception(canned):
    body = b'{"kind":"Status","message":"pods \\"p\\" already bound","code":409}'
    refusal = (
        b"HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nRetry-After: 3\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    server = canned([refusal, refusal, ok()])
    backend = backend_for(server.url)
    with pytest.raises(ApiException) as raised:
        backend.post(EVENT, "namespaces", "ns", "events")
    with pytest.raises(ApiException) as generated:  # the same answer to the generated API
        backend.api.create_namespaced_event("ns", EVENT, _preload_content=False)
    ours, theirs = raised.value, generated.value
    assert (ours.status, ours.reason, ours.body) == (theirs.status, theirs.reason, theirs.body)
    assert dict(ours.headers) == dict(theirs.headers) and type(ours.headers) is type(theirs.headers)
    assert ours.status == 409 and ours.reason == "Conflict" and ours.body == body
    assert said(ours) == '409 Conflict: pods "p" already bound'
    assert _retry_after(ours) == 3.0  # the header read whatever its case
    backend.post(EVENT, "namespaces", "ns", "events")  # the connection was kept
    assert server.connections == 1


def test_a_server_that_hangs_up_is_retried_then_unreachable(canned):
    server = canned([None, ok()])
    backend = backend_for(server.url, retries=2)
    backend.post(EVENT, "namespaces", "ns", "events")  # the second try, on a new connection
    assert len(server.requests) == 2 and server.connections == 2
    gone = canned([None])
    with pytest.raises(BackendUnreachable):
        backend_for(gone.url, retries=1).post(EVENT, "namespaces", "ns", "events")


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 201 Created\r\nContent-Length: 10\r\n\r\n{}",  # cut short
        b"SSH-2.0-OpenSSH\r\n\r\n",  # not HTTP
    ],
)
def test_a_broken_answer_is_an_error_of_the_transport_that_is_retried(canned, answer):
    server = canned([answer, ok()], close_after=True)
    backend = backend_for(server.url, retries=2)
    backend.post(EVENT, "namespaces", "ns", "events")  # the second try is answered
    assert len(server.requests) == 2 and server.connections == 2
    broken = canned([answer], close_after=True)
    with pytest.raises(BackendUnreachable):
        backend_for(broken.url, retries=1).post(EVENT, "namespaces", "ns", "events")


def test_a_server_that_never_answers_times_out_as_configured():
    silent = socket.create_server(("127.0.0.1", 0))  # connections queue, nothing is read
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        backend = backend_for(url, retries=1, timeout_s=0.3)
        started = time.monotonic()
        with pytest.raises(BackendUnreachable, match="timed out"):
            backend.post(EVENT, "namespaces", "ns", "events")
        assert time.monotonic() - started < 5
    finally:
        silent.close()


def test_a_connection_the_server_closed_while_idle_is_replaced_unseen(canned):
    server = canned([ok(), HANG_UP, ok()])
    backend = backend_for(server.url, retries=1)  # no second try to hide behind
    backend.post(EVENT, "namespaces", "ns", "events")
    time.sleep(0.1)  # the server's close arrives: the pool finds the connection dropped
    backend.post(EVENT, "namespaces", "ns", "events")
    assert len(server.requests) == 2 and server.connections == 2
    assert backend.requests == 2


def _tls() -> tuple[ssl.SSLContext, str]:
    """A server context with a self-signed certificate for 127.0.0.1, and the certificate
    as a kubeconfig's certificate-authority-data."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-apiserver")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.NamedTemporaryFile("wb", suffix=".pem") as file:
        file.write(pem + key_pem)
        file.flush()
        context.load_cert_chain(file.name)
    return context, base64.b64encode(pem).decode()


def test_over_tls_the_posts_verify_the_server_and_keep_their_connection(canned):
    context, authority = _tls()
    server = canned([ok(), ok()], tls=context)
    config = kubeconfig_for(server.url)
    config["clusters"][0]["cluster"]["certificate-authority-data"] = authority
    cluster = SimpleNamespace(pk=None, name="c", config={})
    backend = KubernetesBackend(cluster, kubeconfig=config)
    backend.post(EVENT, "namespaces", "ns", "events")
    backend.post(EVENT, "namespaces", "ns", "events")
    assert server.connections == 1 and len(server.requests) == 2
    untrusted = canned([ok()], tls=context)
    with pytest.raises(BackendUnreachable):
        backend_for(untrusted.url, retries=1).post(EVENT, "namespaces", "ns", "events")


def test_through_an_http_proxy_the_rest_layer_posts_and_gets_as_before(canned, monkeypatch):
    job = b'{"kind":"Job"}'
    proxy = canned([ok(), b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(job), job)])
    backend = backend_for("http://apiserver.invalid:6443")
    client = k8s_config.new_client_from_config_dict(kubeconfig_for("http://apiserver.invalid:6443"))
    client.configuration.proxy = proxy.url
    client.rest_client = rest.RESTClientObject(client.configuration)
    monkeypatch.setattr(backend, "_api_client", lambda: client)
    assert isinstance(client.rest_client.pool_manager, urllib3.ProxyManager)
    backend.post(EVENT, "namespaces", "ns", "events")
    assert backend.direct is None
    objects = k8s.CustomObjectsApi(client)
    read = backend.get_json(
        objects.get_namespaced_custom_object, "/unused", "batch", "v1", "ns", "jobs", "j"
    )
    assert read == {"kind": "Job"}
    (line, _, body), (get, _, _) = proxy.requests
    assert line == "POST http://apiserver.invalid:6443/api/v1/namespaces/ns/events HTTP/1.1"
    assert json.loads(body) == EVENT
    assert get == "GET http://apiserver.invalid:6443/apis/batch/v1/namespaces/ns/jobs/j HTTP/1.1"


def test_a_get_asks_for_one_object_with_no_body(canned):
    job = b'{"kind":"Job","metadata":{"name":"j 1"}}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    server = canned([answer + b"Content-Length: %d\r\n\r\n%s" % (len(job), job)])
    backend = backend_for(server.url + "/prefix/")
    path = "/apis/batch/v1/namespaces/ns/jobs/j%201"
    assert backend.get_json(None, path) == json.loads(job)
    ((line, headers, body),) = server.requests
    assert line == "GET /prefix/apis/batch/v1/namespaces/ns/jobs/j%201 HTTP/1.1"
    assert "content-length" not in headers and "content-type" not in headers
    assert headers["authorization"] == "Bearer fake-token" and body == b""
