"""Hub endpoint and credentials, resolved the way huggingface_hub resolves them.

The token is never stored in an object that may be pickled, logged or written: a
:class:`HubCredentials` holds only *where* the token comes from. An explicit ``token=`` is
kept in a shared-memory segment of the process that received it; a pickled copy carries the
segment's name, so DataLoader workers (spawn or forkserver) read the token from memory and it
never travels in a pickle or reaches a file. Otherwise each process asks huggingface_hub
(``HF_TOKEN``, the token file), exactly as the Hub client does.
"""

from __future__ import annotations

import os
import threading
import weakref
from multiprocessing import shared_memory
from typing import Any

from ..workers.shared_segments import attach_untracked, release

_MODES = ("default", "explicit", "anonymous")


def hub_endpoint(endpoint: str | None = None) -> str:
    """``endpoint``, else ``$HF_ENDPOINT`` (read now, not at import), else huggingface_hub's default."""
    if endpoint:
        return endpoint.rstrip("/")
    if os.environ.get("HF_ENDPOINT"):
        return os.environ["HF_ENDPOINT"].rstrip("/")
    from huggingface_hub import constants

    return str(constants.ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` asks for no network access (read now)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


class HubCredentials:
    """Where the Hub token comes from, and the request headers that carry it (per process)."""

    def __init__(self, token: str | bool | None = None) -> None:
        self._segment: shared_memory.SharedMemory | None = None
        self._segment_name: str | None = None
        if isinstance(token, str):
            self.mode = "explicit"
            data = token.encode()
            segment = shared_memory.SharedMemory(create=True, size=max(1, len(data)))
            segment.buf[: len(data)] = data  # type: ignore[index]
            self._segment, self._segment_name = segment, segment.name
            self._length = len(data)
            weakref.finalize(self, release, self._segment)
        elif token is False:
            self.mode = "anonymous"
        else:
            self.mode = "default"
        self._setup()

    def _setup(self) -> None:
        self._headers: dict[str, str] | None = None
        self._lock = threading.Lock()

    def token(self) -> str | None:
        if self.mode == "anonymous":
            return None
        if self.mode == "explicit":
            explicit = self._explicit_token()
            if explicit is not None:
                return explicit
        from huggingface_hub import get_token

        return get_token()

    def _explicit_token(self) -> str | None:
        """The token handed to the creating process, read from its segment (``None`` once it is gone)."""
        if self._segment is None and self._segment_name is not None:
            try:
                self._segment = attach_untracked(self._segment_name)
            except FileNotFoundError:
                return None
        if self._segment is None:
            return None
        return bytes(self._segment.buf[: self._length]).decode()  # type: ignore[index]

    def api_token(self) -> str | bool:
        """What to pass as ``token=`` to huggingface_hub: the token, or ``False`` for none."""
        return self.token() or False

    def __call__(self, url: str = "") -> dict[str, str]:
        """The headers of a Hub request (to ``url``, any): user agent, and authorization when there is a token."""
        with self._lock:
            if self._headers is None:
                from huggingface_hub.utils import build_hf_headers

                self._headers = dict(build_hf_headers(token=self.api_token(), library_name="lerobot_nodes"))
            return self._headers

    def __getstate__(self) -> dict[str, Any]:
        return {"mode": self.mode, "segment": self._segment_name, "length": getattr(self, "_length", 0)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.mode = state["mode"] if state.get("mode") in _MODES else "default"
        self._segment = None
        self._segment_name = state.get("segment")
        self._length = int(state.get("length") or 0)
        self._setup()

    def __repr__(self) -> str:
        return f"HubCredentials({self.mode})"
