"""One aiobotocore session per process for the ``s3://`` file systems this package opens through
s3fs (and no listings cache): an :class:`~.fsspec_source.FsspecSource`, which ``s3://`` roots get
only with s3fs's own ``storage_options`` (others are read natively: :mod:`.s3`).

s3fs gives each file system a session of its own unless it is handed one, and a new session reads
botocore's data for S3 (the service model, endpoint rules and partitions, parsed from JSON) when it
creates its first client. Every DataLoader worker opens its own file system, so every worker paid
that again. :func:`shared_session` is one session per process, and :func:`load_shared_session`
reads its data; called before a process forks, every process forked from it shares those pages
instead of each parsing a copy (per worker about 12 MB of private memory and 70 ms of CPU less:
``benchmarks/s3_session.py``).

A session holds no connection and no credentials until a client asks for them: each process still
resolves its own credentials and opens its own connections, as before.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

S3FS_CLASS = "s3fs.S3FileSystem"
SESSION_OPTION = "session"
"""s3fs's option for a session made by its caller."""
LISTINGS_CACHE_OPTION = "use_listings_cache"
"""fsspec's option to keep the folder listings a file system has made."""

_session: Any = None
_loaded = False


def reads_through_s3fs(url: object) -> bool:
    """Whether fsspec opens ``url`` with s3fs (``s3://``, ``s3a://``)."""
    if not isinstance(url, str) or "://" not in url:
        return False
    from fsspec.registry import known_implementations

    scheme = url.split("://", 1)[0].lower()
    return known_implementations.get(scheme, {}).get("class") == S3FS_CLASS


def shared_session() -> Any:
    """This process's session (made at the first call; a forked process keeps its parent's)."""
    global _session
    if _session is None:
        from aiobotocore.session import AioSession

        _session = AioSession()
    return _session


S3_CLIENT_DATA = ("endpoints", "sdk-default-configuration", "partitions", "_retry")
S3_SERVICE_DATA = ("service-2", "endpoint-rule-set-1")
"""botocore's data files an S3 client is made from (what ``create_client("s3")`` reads: botocore 1.43).
aiobotocore's own ``warm_up_loader_caches`` reads these and the paginators, waiters and examples as
well, 25 ms more than a client needs."""


def load_shared_session() -> None:
    """Parse the S3 data of :func:`shared_session` now (once per process): what every client of it
    is made from. Starts no thread and no event loop, and opens no connection. A file botocore no
    longer has is left to the first client (which reads what it needs, as without this).

    The cyclic garbage collector is paused meanwhile: the parse makes about a hundred thousand
    containers, enough for full collections, and before the fork each of those walks every object
    torch and the rest left in this process (196 ms instead of 51 here). The parsed data holds no
    cycle, so the pause leaves nothing for the collector to find."""
    global _loaded
    if _loaded:
        return
    from botocore.exceptions import DataNotFoundError

    loader = shared_session().get_component("data_loader")
    loads: list[Callable[[], object]] = [functools.partial(loader.load_data, name) for name in S3_CLIENT_DATA]
    loads += [functools.partial(loader.load_service_model, "s3", type_name) for type_name in S3_SERVICE_DATA]
    with _collector_paused():
        for load in loads:
            with contextlib.suppress(DataNotFoundError):
                load()
    _loaded = True


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def s3fs_options(url: str, storage_options: Mapping[str, Any]) -> dict[str, Any]:
    """``storage_options`` for ``url`` as this package opens it. Where fsspec opens it with s3fs:

    - :func:`shared_session`, unless the options (fsspec's configuration included) choose a session
      of their own: ``session`` or one of a session's parameters (``profile``, ``session_vars``...);
    - no listings cache unless the options ask for one (``use_listings_cache``): the source keeps
      its own listing, and s3fs's copy would hold every file's info dict for as long as the file
      system lives (about 1 KB per file: 20 MB at 20,000 files).
    """
    options = dict(storage_options)
    if not reads_through_s3fs(url):
        return options
    options.setdefault(LISTINGS_CACHE_OPTION, False)
    import fsspec
    from aiobotocore.session import AioSession
    from fsspec.config import apply_config

    filesystem_class = fsspec.get_filesystem_class(url.split("://", 1)[0].lower())
    chosen = apply_config(filesystem_class, dict(options))
    if {SESSION_OPTION, *inspect.signature(AioSession).parameters} & chosen.keys():
        return options
    options[SESSION_OPTION] = shared_session()
    return options
