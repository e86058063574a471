"""defer_package_init: a package's submodules import without its ``__init__``, which
runs, whole, the first time the package itself is asked for a name it lacks."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.k8s.lean_import import (
    defer_package_init,
    is_deferred,
    provisional_module,
    provisionally,
)

PKG = "leanpkg_under_test"


@pytest.fixture
def package(tmp_path: Path) -> Iterator[Path]:
    """A package whose ``__init__`` records that it ran and imports a heavy submodule."""
    root = tmp_path / PKG
    (root / "inner").mkdir(parents=True)
    (root / "__init__.py").write_text(
        textwrap.dedent(
            """
            import sys
            sys.modules[__name__].__dict__.setdefault("runs", 0)
            runs += 1
            from . import heavy
            from .light import Light as Exported
            WHOLE = True

            def __getattr__(name):
                if name == "LAZY":
                    return "from the package's own __getattr__"
                raise AttributeError(name)
            """
        )
    )
    (root / "light.py").write_text("class Light:\n    pass\n")
    (root / "heavy.py").write_text("LOADED = True\n")
    (root / "inner" / "__init__.py").write_text("raise RuntimeError('inner __init__ ran')\n")
    (root / "inner" / "leaf.py").write_text("from leanpkg_under_test.light import Light\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield root
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == PKG or m.startswith(PKG + ".")]:
            del sys.modules[name]


def test_submodules_import_without_the_init(package: Path) -> None:
    defer_package_init(PKG)
    defer_package_init(f"{PKG}.inner")
    from leanpkg_under_test.inner.leaf import Light  # type: ignore[import-not-found]

    assert Light.__module__ == f"{PKG}.light"
    assert is_deferred(PKG) and is_deferred(f"{PKG}.inner")
    assert f"{PKG}.heavy" not in sys.modules
    assert "runs" not in sys.modules[PKG].__dict__


def test_a_missing_name_runs_the_init_once_then_answers(package: Path) -> None:
    defer_package_init(PKG)
    module = sys.modules[PKG]
    assert module.WHOLE is True
    assert module.runs == 1
    assert f"{PKG}.heavy" in sys.modules
    assert not is_deferred(PKG)
    # The package's own __getattr__ answers after its init ran.
    assert module.LAZY == "from the package's own __getattr__"
    with pytest.raises(AttributeError):
        _ = module.NOT_THERE
    assert module.runs == 1


def test_exports_and_submodules_answer_without_the_init(package: Path) -> None:
    defer_package_init(PKG, {"Light": f"{PKG}.light"})
    from leanpkg_under_test import Light, light  # type: ignore[import-not-found]

    assert light.Light is Light
    assert is_deferred(PKG)
    assert "runs" not in sys.modules[PKG].__dict__


def test_dunder_probes_do_not_run_the_init(package: Path) -> None:
    defer_package_init(PKG)
    module = sys.modules[PKG]
    assert not hasattr(module, "__wrapped__")
    assert is_deferred(PKG)
    # __all__ is a question about the package's contents: its init answers it.
    assert not hasattr(module, "__all__")
    assert not is_deferred(PKG)
    assert module.runs == 1


def test_an_imported_package_is_left_alone(package: Path) -> None:
    import leanpkg_under_test

    defer_package_init(PKG)
    assert sys.modules[PKG] is leanpkg_under_test
    assert not is_deferred(PKG)
    assert leanpkg_under_test.runs == 1


def test_not_a_package_is_refused(package: Path) -> None:
    defer_package_init(PKG)
    with pytest.raises(ImportError, match="not an importable package"):
        defer_package_init(f"{PKG}.light")


# What the kubelet plugin imports, in a process of its own: the client it builds must
# not have pulled in the official client's generated models, its dynamic client, or
# the kubeconfig loader's OAuth stack (20 MB of RSS the plugin never uses).
PLUGIN_IMPORTS = """
import sys
from dra_driver.k8s.lean_import import defer_official_client_inits
defer_official_client_inits()  # what the entry point (dra_driver.cli.run) does first
import dra_driver.cli
dra_driver.cli.build_parser()
import dra_driver.app.plugin
from dra_driver.k8s.client import make_api_client
from dra_driver.k8s.transport import api_transport
assert api_transport(make_api_client(None, host="http://127.0.0.1:1")) is not None
heavy = {"pydantic", "requests", "oauthlib", "kubernetes_validate", "websocket"}
heavy = {m.split(".")[0] for m in sys.modules} & heavy
heavy |= {m for m in sys.modules if m.startswith((
    "kubernetes.client.models.", "kubernetes.client.api.", "kubernetes.client.api_client",
    "kubernetes.dynamic", "kubernetes.watch", "kubernetes.stream",
    "kubernetes.config.kube_config",
))}
print(",".join(sorted(heavy)))
"""


def test_the_plugin_imports_only_the_clients_transport() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PLUGIN_IMPORTS], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "", done.stdout


WHOLE_CLIENT = """
from dra_driver.k8s.lean_import import defer_official_client_inits
defer_official_client_inits()
import dra_driver.k8s.client
from kubernetes import client, watch
print(client.V1Pod.__name__, watch.Watch.__name__, client.ApiClient.__module__)
"""


def test_the_whole_official_client_still_imports_after_the_lean_one() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WHOLE_CLIENT], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["V1Pod", "Watch", "kubernetes.client.api_client"]


KUBECONFIG_PATH = """
import sys, tempfile
from dra_driver.k8s.lean_import import defer_official_client_inits
defer_official_client_inits()
from dra_driver.k8s.client import make_api_client
path = tempfile.mktemp()
with open(path, "w") as f:
    f.write(
        "apiVersion: v1\\nkind: Config\\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\\n"
        "users: [{name: u, user: {token: t}}]\\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\\ncurrent-context: x\\n"
    )
client = make_api_client(path)
assert client.auth_headers() == {"authorization": "Bearer t"}, client.auth_headers()
loaded = ("pydantic", "kubernetes.client.api_client", "requests", "oauthlib.oauth2.rfc6749")
print(*(name in sys.modules for name in loaded))
from kubernetes.config import kube_config
made = kube_config.ApiClient(configuration=client.configuration)  # what an OIDC refresh does
session = kube_config.OAuth2Session(client_id="c", token={"access_token": "a"})
import kubernetes.client
import requests_oauthlib
from kubernetes.client.api_client import ApiClient
print(type(made) is ApiClient, kubernetes.client.ApiClient is ApiClient)
print(type(session) is requests_oauthlib.OAuth2Session, hasattr(requests_oauthlib, "__file__"))
print(isinstance(kube_config.oauthlib.oauth2.rfc6749.errors.InvalidClientIdError("x"), Exception))
"""


def test_a_kubeconfig_loads_without_what_only_an_oidc_refresh_uses() -> None:
    """The kubeconfig loader binds ``ApiClient``, ``OAuth2Session`` and ``oauthlib``
    when imported: it gets classes that import the real ones when called and return
    real instances, and oauthlib deferred; the packages themselves are the real ones."""
    done = subprocess.run(
        [sys.executable, "-c", KUBECONFIG_PATH], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["False"] * 4 + ["True"] * 5, done.stdout


def test_a_provisional_name_lasts_for_the_block_only(package: Path) -> None:
    defer_package_init(PKG, {"Light": f"{PKG}.light"})
    module = sys.modules[PKG]
    stand_in = object()
    with provisionally(PKG, "Light", stand_in):
        from leanpkg_under_test import Light

        assert Light is stand_in
    assert module.Light is not stand_in  # the export answers again
    with pytest.raises(ValueError, match="already set"), provisionally(PKG, "Light", stand_in):
        pass
    assert is_deferred(PKG)


def test_a_provisional_module_answers_imports_inside_the_block_only(package: Path) -> None:
    name = f"{PKG}_standin"
    with provisional_module(name, {"Thing": 42}):
        assert importlib.import_module(name).Thing == 42
    assert name not in sys.modules
    with pytest.raises(ImportError):
        importlib.import_module(name)  # nothing real by that name
    real = importlib.import_module(f"{PKG}.light")
    with provisional_module(f"{PKG}.light", {"Thing": 42}):
        assert importlib.import_module(f"{PKG}.light") is real  # already imported
