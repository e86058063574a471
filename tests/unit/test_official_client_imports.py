"""Importing the driver's modules leaves the official ``kubernetes`` package as it ships.

Only a driver process's entry point defers the package's ``__init__``s
(:func:`dra_driver.cli.run`); a test, a tool or a user's script that imports
``dra_driver`` modules, each entry point's module included, then uses the whole
client: its ``__version__``, the dynamic client, watches, a kubeconfig with an
OAuth (OIDC) auth provider. Each case runs in a fresh interpreter, since what is
checked is how the process's imports went.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ENTRY_POINT_MODULES = (
    "dra_driver.k8s.official",
    "dra_driver.k8s.client",
    "dra_driver.cli",
    "dra_driver.cli.plugin",
    "dra_driver.cli.controller",
    "dra_driver.cli.tools",
    "dra_driver.app.plugin",
    "dra_driver.app.controller",
    "dra_driver.app.agent",
    "dra_driver.demo",
)


def _jwt(claims: dict[str, object]) -> str:
    def part(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}.c2ln"


def _oidc_kubeconfig(path: Path) -> None:
    """A kubeconfig whose user authenticates with the ``oidc`` auth provider, with an
    ID token valid for an hour (so loading it refreshes nothing)."""
    token = _jwt({"iss": "https://issuer.test", "exp": int(time.time()) + 3600})
    path.write_text(
        textwrap.dedent(
            f"""
            apiVersion: v1
            kind: Config
            clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:1"}}}}]
            users:
            - name: u
              user:
                auth-provider:
                  name: oidc
                  config:
                    client-id: fgd
                    client-secret: s
                    id-token: {token}
                    idp-issuer-url: https://issuer.test
                    refresh-token: r
            contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
            current-context: x
            """
        )
    )


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("module", ENTRY_POINT_MODULES)
def test_after_a_driver_module_the_whole_client_imports(module: str, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    _oidc_kubeconfig(kubeconfig)
    out = _run(
        textwrap.dedent(
            f"""
            import importlib, sys
            importlib.import_module({module!r})
            from kubernetes import __version__
            import kubernetes.dynamic, kubernetes.watch
            from kubernetes import client, config
            from kubernetes.dynamic import DynamicClient
            config.load_kube_config(config_file={str(kubeconfig)!r})
            api = client.ApiClient()
            assert api.configuration.api_key["BearerToken"].startswith("Bearer "), "no token"
            import requests_oauthlib
            from kubernetes.config import kube_config
            # The real OAuth2Session, bound where the loader's refresh uses it.
            assert kube_config.OAuth2Session is requests_oauthlib.OAuth2Session
            assert hasattr(requests_oauthlib, "__file__")
            print(__version__, DynamicClient.__name__, kubernetes.watch.Watch.__name__)
            """
        )
    )
    version, dynamic, watch = out.split()
    assert version[0].isdigit() and dynamic == "DynamicClient" and watch == "Watch"


def test_the_driver_own_kubeconfig_load_leaves_the_client_whole(tmp_path: Path) -> None:
    """The driver's own loader (``dra_driver.k8s.client.make_api_client``), in a process
    that did not defer: the OIDC kubeconfig loads and the package stays the real one."""
    kubeconfig = tmp_path / "kubeconfig"
    _oidc_kubeconfig(kubeconfig)
    out = _run(
        textwrap.dedent(
            f"""
            import sys
            from dra_driver.k8s.client import make_api_client
            made = make_api_client({str(kubeconfig)!r})
            assert made.auth_headers()["authorization"].startswith("Bearer "), "no token"
            import kubernetes, requests_oauthlib
            from kubernetes.config import kube_config
            print(kubernetes.__version__ == sys.modules["kubernetes"].__version__,
                  kube_config.OAuth2Session is requests_oauthlib.OAuth2Session,
                  "__getattr__" in vars(sys.modules["kubernetes"]))
            """
        )
    )
    assert out.split() == ["True", "True", "False"], out


def test_the_console_script_and_python_m_run_the_entry_point() -> None:
    """Both ways of starting a driver process go through :func:`dra_driver.cli.run`."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["dra-driver"] == "dra_driver.cli:run"
    out = _run(
        textwrap.dedent(
            """
            import runpy, sys
            sys.argv = ["dra-driver", "version"]
            try:
                runpy.run_module("dra_driver", run_name="__main__")
            except SystemExit as done:
                assert done.code == 0, done.code
            from dra_driver.k8s.lean_import import is_deferred
            print(is_deferred("kubernetes"), is_deferred("kubernetes.client"))
            """
        )
    )
    assert out.split()[-2:] == ["True", "True"], out
