"""The pod webhook's TLS (deploy/webhook/, `manage.py webhook_cert`): kube-apiserver calls
`https://<service>.<namespace>.svc:443`, and checks the serving certificate against the
caBundle of the MutatingWebhookConfiguration. Nothing is downloaded: a self-signed CA and a
serving certificate for the Service's DNS names are made with `cryptography`, kept in the
Secret that the webhook's pods mount, and the CA is written as the configuration's caBundle
(with the path naming the cluster, and the admin's failurePolicy).

`webhook_cert_ensure` is idempotent: a certificate that is valid for the names for more than
`renew_days` is kept (the configuration is still brought up to date); otherwise a new CA and
certificate replace both. The webhook's pods read the files at start: restart them after a
renewal (`kubectl -n gpupool rollout restart deployment/gpupool-webhook`).
"""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from django.conf import settings
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from clusters.backends import BackendError
from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.errors import said
from clusters.models import Cluster

CA_KEY, CERT_KEY, KEY_KEY = "ca.crt", "tls.crt", "tls.key"


@dataclass(frozen=True, slots=True)
class Target:
    """Where the certificate goes: the Service, its Secret and the configuration."""

    namespace: str = "gpupool"
    service: str = "gpupool-webhook"
    secret: str = "gpupool-webhook-tls"
    configuration: str = "gpupool"

    @property
    def dns_names(self) -> list[str]:
        base = f"{self.service}.{self.namespace}.svc"
        return [self.service, f"{self.service}.{self.namespace}", base, f"{base}.cluster.local"]


@dataclass(frozen=True, slots=True)
class Pem:
    ca: bytes
    cert: bytes
    key: bytes


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def certificate_make(target: Target, now: dt.datetime, days: int) -> Pem:
    """A CA (its key is thrown away: it signs this one certificate) and a serving
    certificate for the Service's names, both valid `days` from `now`."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"gpupool-webhook-ca-{now:%Y%m%d%H%M%S}")
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)

    def builder(subject: x509.Name, public: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
        )

    ca = (
        builder(ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_ca_usage(), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    cert = (
        builder(_name(target.dns_names[2]), key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in target.dns_names]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    encoding = serialization.Encoding.PEM
    return Pem(ca.public_bytes(encoding), cert.public_bytes(encoding), key_pem)


def _ca_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


def still_good(data: dict, target: Target, now: dt.datetime, renew_days: int) -> bool:
    """Whether the Secret's certificate names the Service and lives past the renewal time."""
    try:
        cert = x509.load_pem_x509_certificate(base64.b64decode(data[CERT_KEY]))
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (KeyError, ValueError, x509.ExtensionNotFound):
        return False
    if set(target.dns_names) - set(names.get_values_for_type(x509.DNSName)):
        return False
    return cert.not_valid_after_utc > now + dt.timedelta(days=renew_days)


def webhook_cert_ensure(
    cluster: Cluster, target: Target, *, days: int = 365, renew_days: int = 30, now: dt.datetime
) -> str:
    """1. read the Secret (deploy/webhook/ makes it, empty); 2. keep its certificate, or
    make and store a new one; 3. write the CA, the path naming the cluster and the
    failurePolicy into every webhook of the configuration. What was done, in words."""
    backend = KubernetesBackend(cluster)
    try:
        secret = backend.api.read_namespaced_secret(target.secret, target.namespace)
        data = secret.data or {}
        renewed = not still_good(data, target, now, renew_days)
        if renewed:
            pem = certificate_make(target, now, days)
            data = {
                CA_KEY: base64.b64encode(pem.ca).decode(),
                CERT_KEY: base64.b64encode(pem.cert).decode(),
                KEY_KEY: base64.b64encode(pem.key).decode(),
            }
            backend.api.patch_namespaced_secret(target.secret, target.namespace, {"data": data})
        _configure(backend, cluster, target, data[CA_KEY])
    except ApiException as exc:
        raise BackendError(f"{cluster.name}: {said(exc)}") from exc
    valid = "a new certificate" if renewed else "the certificate in place"
    return (
        f"{target.configuration}: {valid} for {target.dns_names[2]}, path "
        f"{webhook_path(cluster)}, failurePolicy {settings.GPUPOOL_WEBHOOK_FAILURE_POLICY}"
    )


def webhook_path(cluster: Cluster) -> str:
    return f"/k8s/admission/{cluster.uid}/pods/"


def _configure(backend: KubernetesBackend, cluster: Cluster, target: Target, ca: str) -> None:
    """A JSON patch of each webhook's caBundle, service path and failurePolicy (the
    configuration's other fields are the manifest's)."""
    admission = k8s.AdmissionregistrationV1Api(backend.api.api_client)
    found = admission.read_mutating_webhook_configuration(target.configuration)
    operations = []
    for i, _hook in enumerate(found.webhooks or []):
        operations += [
            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": ca},
            {"op": "add", "path": f"/webhooks/{i}/clientConfig/service/path",
             "value": webhook_path(cluster)},
            {"op": "add", "path": f"/webhooks/{i}/failurePolicy",
             "value": settings.GPUPOOL_WEBHOOK_FAILURE_POLICY},
        ]  # fmt: skip
    if operations:
        admission.patch_mutating_webhook_configuration(target.configuration, operations)
