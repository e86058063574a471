"""The Kubernetes name grammar (pure): ``None`` when a value is a valid name, else the words.

DNS labels and subdomains, driver names, C identifiers, attribute and capacity
names (``ident`` or ``<domain>/<ident>``), label keys and label values, with the
resource.k8s.io/v1 length limits they use. Moved out of
:mod:`dra_driver.core.slices.grammar` (and the limits out of
:mod:`dra_driver.core.slices.limits`) so that ``api/`` can check names without
importing ``core/``.
"""

from __future__ import annotations

import re

MAX_IDENTIFIER = 32
MAX_DOMAIN = 63
MAX_DNS_LABEL = 63
MAX_DNS_SUBDOMAIN = 253

_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
LABEL_NAME_RE = re.compile(r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def dns_label(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if len(name) > MAX_DNS_LABEL:
        return f"must be no more than {MAX_DNS_LABEL} characters (DNS label)"
    if not _DNS_LABEL.fullmatch(name):
        return "must be a DNS label: lower case alphanumerics or '-', alphanumeric at both ends"
    return None


def dns_subdomain(name: object, limit: int = MAX_DNS_SUBDOMAIN) -> str | None:
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if len(name) > limit:
        return f"must be no more than {limit} characters"
    if not all(_DNS_LABEL.fullmatch(part) for part in name.split(".")):
        return "must be a DNS subdomain: DNS labels separated by '.'"
    return None


def driver_name(name: object) -> str | None:
    # The API reuses the CSI driver-name check: ≤63, a DNS subdomain once lower-cased.
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if len(name) > MAX_DOMAIN:
        return f"must be no more than {MAX_DOMAIN} characters"
    return dns_subdomain(name.lower())


def c_identifier(name: str) -> str | None:
    if len(name) > MAX_IDENTIFIER:
        return f"identifier {name!r} must be no more than {MAX_IDENTIFIER} characters"
    if not _C_IDENTIFIER.fullmatch(name):
        return f"{name!r} must be a C identifier ([A-Za-z_][A-Za-z0-9_]*)"
    return None


def qualified_name(name: object) -> str | None:
    """Attribute and capacity names: ``ident`` or ``<domain>/<ident>``."""
    if not isinstance(name, str) or not name:
        return "the name must be a non-empty string"
    domain, slash, ident = name.rpartition("/")
    if not slash:
        return c_identifier(name)
    problem = None
    if not domain or "/" in domain:
        problem = "must be an identifier or <domain>/<identifier>"
    elif domain_problem := driver_name(domain):
        problem = f"domain {domain!r} {domain_problem}"
    elif not ident:
        problem = "the name after the domain must not be empty"
    return problem or c_identifier(ident)


def label_name(key: object) -> str | None:
    if not isinstance(key, str) or not key:
        return "must be a non-empty string"
    prefix, _, name = key.rpartition("/")
    if "/" in key:
        problem = dns_subdomain(prefix)
        if problem:
            return f"prefix {problem}"
    if len(name) > MAX_DNS_LABEL or not LABEL_NAME_RE.fullmatch(name):
        return (
            "name part must be no more than 63 alphanumerics, '-', '_' or '.',"
            " alphanumeric at both ends"
        )
    return None


def label_value(value: object) -> str | None:
    if not isinstance(value, str):
        return "must be a string"
    if value and (len(value) > MAX_DNS_LABEL or not LABEL_NAME_RE.fullmatch(value)):
        return "must be empty or no more than 63 alphanumerics, '-', '_' or '.'"
    return None
