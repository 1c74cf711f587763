"""Is the Hugging Face hub reachable? One TCP connect with a short timeout, asked once per process (torch-free).

``huggingface_hub`` retries an unreachable hub five times with growing back-off before it gives up (about 25 s for
``kvlab plan owner/name`` on a machine without network). kvlab first looks in the local cache; on a miss it asks
:func:`hub_reachable` and, when the hub cannot be reached, fails at once with an error that says so.
"""

from __future__ import annotations

import functools
import os
import socket
from urllib.parse import urlparse

DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_TIMEOUT_S = 3.0


def hub_endpoint() -> str:
    """The hub's base URL: ``HF_ENDPOINT`` when set (a mirror), else https://huggingface.co."""
    return os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT


def hub_offline_reason() -> str | None:
    """Why the hub cannot be used right now, or None when it can: ``HF_HUB_OFFLINE`` set, or no TCP connection to
    the endpoint within :data:`CONNECT_TIMEOUT_S` seconds (DNS failure, no route, refused), or an ``HF_ENDPOINT``
    that is not a URL with a host (a bad port, a broken IPv6 address). Cached per process."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    return _probe(hub_endpoint())


@functools.lru_cache(maxsize=4)
def _probe(endpoint: str) -> str | None:
    try:
        url = urlparse(endpoint)
        host, port = url.hostname, url.port  # .port raises for "host:99999" / "host:abc"
    except ValueError as e:
        return f"HF_ENDPOINT {endpoint!r} is not a URL ({e})"
    if not host:
        return f"HF_ENDPOINT {endpoint!r} names no host"
    port = port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return None
    except OSError as e:  # socket.gaierror, timeout, refused, unreachable
        return f"{host}:{port} is unreachable ({e.strerror or type(e).__name__})"
