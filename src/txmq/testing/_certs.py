"""Throw-away TLS certificates for tests and benchmarks, made with the ``openssl`` command."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import msgspec

from txmq.errors import LocalError

__all__ = ["TestCertificates", "make_test_certificates"]

_OPENSSL_TIMEOUT_S = 60.0
_VALID_DAYS = "2"
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


class TestCertificates(msgspec.Struct, frozen=True):
    """PEM files in one directory: a CA, a server certificate signed by it for ``localhost`` and
    ``127.0.0.1`` (subject alternative names), a client certificate signed by it, and a second CA
    that signed nothing here (a certificate checked against it fails)."""

    __test__ = False  # not a pytest test class

    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert_file: Path
    client_key_file: Path
    other_ca_file: Path


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise LocalError("the openssl command is not installed; it makes the test certificates")
    p = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True,
                       timeout=_OPENSSL_TIMEOUT_S, check=False)
    if p.returncode:
        raise LocalError(f"openssl {args[0]} failed: {p.stderr.strip()[-2000:]}")


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", *_KEY, "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days",
             _VALID_DAYS, "-subj", f"/CN=txmq test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def _leaf(d: Path, name: str, cn: str, ext: str) -> None:
    (d / f"{name}.ext").write_text(ext)
    _openssl("req", *_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}",
             cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", _VALID_DAYS, "-extfile",
             f"{name}.ext", cwd=d)


def make_test_certificates(directory: Path) -> TestCertificates:
    """Make :class:`TestCertificates` in ``directory`` (created if needed): EC P-256 keys,
    valid two days.

    Raises:
        LocalError: no ``openssl`` command, or it failed (its message is included).
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "other-ca")
    _leaf(d, "server", "localhost", "basicConstraints=CA:FALSE\n"
          "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _leaf(d, "client", "txmq test client", "basicConstraints=CA:FALSE\n"
          "extendedKeyUsage=clientAuth\n")
    return TestCertificates(ca_file=d / "ca.pem", cert_file=d / "server.pem",
                            key_file=d / "server.key", client_cert_file=d / "client.pem",
                            client_key_file=d / "client.key", other_ca_file=d / "other-ca.pem")
