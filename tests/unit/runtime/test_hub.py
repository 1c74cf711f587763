"""The hub reachability probe, and that plan / load_model fail at once (no retries) when the hub is unreachable."""

from __future__ import annotations

import socket

import pytest

from kvlab.runtime import hub


@pytest.fixture(autouse=True)
def _fresh_probe():
    hub._probe.cache_clear()
    yield
    hub._probe.cache_clear()


def test_offline_env_wins(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.hub_offline_reason() == "HF_HUB_OFFLINE is set"


def test_listening_endpoint_is_reachable_and_closed_port_is_not(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        assert hub.hub_offline_reason() is None
    finally:
        server.close()
    hub._probe.cache_clear()
    reason = hub.hub_offline_reason()  # the same port, now closed: refused at once
    assert reason is not None and f"127.0.0.1:{port} is unreachable" in reason


def test_endpoint_without_host(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "not-a-url")
    assert "names no host" in hub.hub_offline_reason()


def test_plan_hub_id_fails_at_once_when_offline(monkeypatch):
    from kvlab.plan import load

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    calls = []
    import huggingface_hub

    real = huggingface_hub.hf_hub_download

    def spy(*a, **k):
        calls.append(k.get("local_files_only", False))
        return real(*a, **k)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", spy)
    with pytest.raises(
        ValueError, match=r"'nobody-xyz/none' is not in the local Hugging Face cache .*HF_HUB_OFFLINE"
    ):
        load._hub_config("nobody-xyz/none")
    assert calls == [True]  # only the cache was asked, never the network


def test_load_model_hub_id_fails_at_once_when_offline(monkeypatch):
    from kvlab.models import load_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        OSError, match=r"'nobody-xyz/none' is not a local directory, not in the local Hugging Face"
    ):
        load_model("nobody-xyz/none")
