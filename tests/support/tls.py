"""A self-signed certificate for 127.0.0.1, made with the ``openssl`` command, and
the server context that serves it: the fake API server over HTTPS, as every real
API server is, so that the in-cluster configuration (CA file, bearer token,
``https://$KUBERNETES_SERVICE_HOST``) is exercised for real."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class SelfSigned:
    cert: str
    """PEM certificate: also the CA file a client trusts (``ca.crt``)."""
    key: str


def openssl_missing() -> str | None:
    """Why no certificate can be made here, or None."""
    return None if shutil.which("openssl") else "the openssl command is not installed"


def self_signed(directory: str) -> SelfSigned:
    """An EC P-256 certificate for IP 127.0.0.1, valid for a day, in ``directory``."""
    os.makedirs(directory, exist_ok=True)
    cert, key = os.path.join(directory, "ca.crt"), os.path.join(directory, "tls.key")
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec"),
            *("-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"),
            *("-keyout", key, "-out", cert, "-subj", "/CN=fake-kube-apiserver"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return SelfSigned(cert, key)


def server_context(pair: SelfSigned) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pair.cert, pair.key)
    return context
