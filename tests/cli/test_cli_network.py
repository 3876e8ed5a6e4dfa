"""A Hub that cannot be reached, or refuses the repo, is one ``error:`` line naming it and what to do.

Real CLI processes against loopback endpoints only: a closed 127.0.0.1 port (connection refused),
an ``.invalid`` host (RFC 6761: it resolves nowhere, with or without a network), the loopback Hub
serving a private repo (401) and a missing one (404), and a loopback server that answers 403.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lerobot_nodes.testing.hub import LoopbackHub

from .cli_process import assert_one_line_error, run_cli

COMMANDS = {"stream": ("--steps=1", "--num_workers=0"), "inspect": ()}
OFFLINE_ADVICE = "or set HF_HUB_OFFLINE=1 to read a local copy from $HF_LEROBOT_HOME/<repo_id>"


def _hub_env(endpoint: str, tmp_path: Path) -> dict[str, str]:
    """The CLI's environment: this endpoint, no token (none in the environment, none stored), no Xet."""
    return {
        "HF_ENDPOINT": endpoint,
        "HF_TOKEN": "",
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


@pytest.fixture
def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def hub(tiny_dataset: Path) -> Iterator[LoopbackHub]:
    """A loopback Hub serving ``owner/tiny`` (public, anonymous reads)."""
    with LoopbackHub() as server:
        server.add_dataset("owner/tiny", tiny_dataset)
        yield server


@pytest.fixture
def private_hub(tiny_dataset: Path) -> Iterator[LoopbackHub]:
    """A loopback Hub that answers 401 to any request without its token, as the Hub does for a private repo."""
    with LoopbackHub(require_token="hf_loopback_secret") as server:
        server.add_dataset("owner/private", tiny_dataset)
        yield server


class _Forbidden(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"error": "Access to this resource is forbidden"}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def forbidding_endpoint() -> Iterator[str]:
    """A loopback endpoint answering 403 to every request."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
    thread = threading.Thread(target=server.serve_forever, name="forbidding-endpoint", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize("command", COMMANDS)
def test_connection_refused_is_one_line_naming_the_endpoint(command: str, closed_port: int, tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port}"
    result = run_cli(command, "--dataset.repo_id=owner/tiny", *COMMANDS[command], env=_hub_env(endpoint, tmp_path))
    error = assert_one_line_error(result, 1, f"cannot reach the Hub at {endpoint} (connection refused")
    assert f"check the network and HF_ENDPOINT (it is {endpoint})" in error, error
    assert OFFLINE_ADVICE in error, error
    assert "/api/datasets/owner/tiny" in error, error  # the request that failed
    assert result.stderr.splitlines()[-1].startswith("hint: --debug"), result.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unresolvable_host_is_one_line_naming_it(command: str, tmp_path: Path) -> None:
    endpoint = "http://hub.lerobot-nodes.invalid"
    result = run_cli(command, "--dataset.repo_id=owner/tiny", *COMMANDS[command], env=_hub_env(endpoint, tmp_path))
    error = assert_one_line_error(result, 1, f"cannot reach the Hub at {endpoint} (the host name does not resolve")
    assert "HF_ENDPOINT" in error and OFFLINE_ADVICE in error, error


def test_debug_prints_the_traceback_of_a_network_failure(closed_port: int, tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port}"
    result = run_cli("inspect", "--debug", "--dataset.repo_id=owner/tiny", env=_hub_env(endpoint, tmp_path))
    assert result.returncode == 1, result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.splitlines()[-1].startswith(f"error: cannot reach the Hub at {endpoint} (connection refused")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_repo_is_one_line(command: str, hub: LoopbackHub, tmp_path: Path) -> None:
    result = run_cli(command, "--dataset.repo_id=owner/missing", *COMMANDS[command], env=_hub_env(hub.endpoint, tmp_path))
    error = assert_one_line_error(result, 1, "dataset repo owner/missing: not found at ")
    assert hub.endpoint in error and "404" in error, error


@pytest.mark.parametrize("command", COMMANDS)
def test_a_private_repo_without_a_token_is_one_line(command: str, private_hub: LoopbackHub, tmp_path: Path) -> None:
    env = _hub_env(private_hub.endpoint, tmp_path)
    result = run_cli(command, "--dataset.repo_id=owner/private", *COMMANDS[command], env=env)
    error = assert_one_line_error(result, 1, f"dataset repo owner/private: {private_hub.endpoint} answered 401")
    assert "no valid token" in error, error
    result = run_cli(command, "--dataset.repo_id=owner/private", *COMMANDS[command], env={**env, "HF_TOKEN": "hf_wrong"})
    assert_one_line_error(result, 1, f"dataset repo owner/private: {private_hub.endpoint} answered 401")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_forbidden_repo_is_one_line(command: str, forbidding_endpoint: str, tmp_path: Path) -> None:
    result = run_cli(command, "--dataset.repo_id=owner/tiny", *COMMANDS[command], env=_hub_env(forbidding_endpoint, tmp_path))
    assert_one_line_error(result, 1, f"dataset repo owner/tiny: {forbidding_endpoint} answered 403")


def test_a_sidecar_build_from_an_unreachable_hub_is_one_line(closed_port: int, tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port}"
    output = tmp_path / "sidecar.npz"
    result = run_cli(
        "--repo-id=owner/tiny", f"--output={output}", command="lerobot-build-mp4-sidecar", env=_hub_env(endpoint, tmp_path)
    )
    error = assert_one_line_error(result, 1, f"build failed, {output} was left as it was: cannot reach the Hub at {endpoint}")
    assert OFFLINE_ADVICE in error, error
    assert not output.exists()


def test_hub_requests_are_not_logged_unless_asked(hub: LoopbackHub, tmp_path: Path) -> None:
    """huggingface_hub's HTTP client logs every request at INFO: kept at WARNING unless -v or --debug."""
    env = _hub_env(hub.endpoint, tmp_path)
    quiet = run_cli("inspect", "--dataset.repo_id=owner/tiny", env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert "HTTP Request:" not in quiet.stderr, quiet.stderr
    assert "INFO lerobot_nodes." in quiet.stderr  # the package's own log lines stay
    for flag in ("-v", "--verbose", "--debug"):
        verbose = run_cli("inspect", flag, "--dataset.repo_id=owner/tiny", env=env)
        assert verbose.returncode == 0, verbose.stderr
        assert f"HTTP Request: GET {hub.endpoint}/api/datasets/owner/tiny" in verbose.stderr, (flag, verbose.stderr)
