"""The loopback Hub against the real huggingface_hub client (no mocks) and plain urllib3.

The client-facing tests prove the wire shapes are what huggingface_hub 2.4.0 accepts; the urllib3
tests pin the HTTP semantics a native range reader relies on (ranges, redirects, expiry, faults).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.client import IncompleteRead, RemoteDisconnected
from pathlib import Path

import pytest
import urllib3
from huggingface_hub import HfApi, HfFileSystem, hf_hub_download
from huggingface_hub.errors import (
    BucketNotFoundError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from lerobot_nodes.testing.hub import LoopbackHub

REPO_ID = "lerobot-nodes/small"
BUCKET_ID = "lerobot-nodes/small-bucket"
VIDEO = "videos/observation.images.top/chunk-000/file-000.mp4"
DATA = "data/chunk-000/file-000.parquet"
INFO = "meta/info.json"

HubFactory = Callable[..., LoopbackHub]


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def served(loopback_hub: LoopbackHub, small_dataset: Path) -> tuple[LoopbackHub, str]:
    """The default hub serving the small dataset; returns (hub, commit sha)."""
    return loopback_hub, loopback_hub.add_dataset(REPO_ID, small_dataset)


@pytest.fixture
def http() -> Iterator[urllib3.PoolManager]:
    """No retries and no redirects: each call is exactly one request, as the hub records it."""
    pool = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=2.0, read=5.0))
    yield pool
    pool.clear()


def _resolve_url(hub: LoopbackHub, revision: str, path: str) -> str:
    return f"{hub.endpoint}/datasets/{REPO_ID}/resolve/{revision}/{path}"


def _cdn_url(hub: LoopbackHub, http: urllib3.PoolManager, revision: str, path: str) -> str:
    answer = http.request("GET", _resolve_url(hub, revision, path), redirect=False)
    assert answer.status == 302, answer.status
    location = answer.headers["Location"]
    assert location.startswith(hub.cdn_endpoint + "/")
    return location


# ----------------------------------------------------------------------------- the real client


def test_repo_info_by_sha_tag_and_branch(served: tuple[LoopbackHub, str]) -> None:
    hub, sha = served
    api = HfApi(endpoint=hub.endpoint)
    assert re.fullmatch(r"[0-9a-f]{40}", sha)
    assert api.repo_info(REPO_ID, repo_type="dataset").sha == sha
    assert api.repo_info(REPO_ID, repo_type="dataset", revision="v3.0").sha == sha
    assert api.repo_info(REPO_ID, repo_type="dataset", revision="main").sha == sha
    assert api.repo_info(REPO_ID, repo_type="dataset", revision=sha).id == REPO_ID
    moved = hub.commit_files(REPO_ID, {"README.md": b"# small\n"}, message="card")
    assert (
        api.repo_info(REPO_ID, repo_type="dataset", revision="main").sha
        == moved
        == hub.branch_head(REPO_ID, "main")
    )
    assert api.repo_info(REPO_ID, repo_type="dataset", revision="v3.0").sha == sha  # tags pin


def test_list_repo_refs_reports_branches_and_tags(served: tuple[LoopbackHub, str]) -> None:
    hub, sha = served
    hub.tag(REPO_ID, "v3.0-rc", "main")
    refs = HfApi(endpoint=hub.endpoint).list_repo_refs(REPO_ID, repo_type="dataset")
    assert [(b.name, b.target_commit) for b in refs.branches] == [("main", sha)]
    assert {t.name: t.target_commit for t in refs.tags} == {"v3.0": sha, "v3.0-rc": sha}


def test_list_repo_tree_recursive_has_sizes_lfs_sha256_and_xet_hash(
    served: tuple[LoopbackHub, str], small_dataset: Path
) -> None:
    hub, sha = served
    expected = _files(small_dataset)
    entries = list(
        HfApi(endpoint=hub.endpoint).list_repo_tree(
            REPO_ID, repo_type="dataset", revision=sha, recursive=True
        )
    )
    files = {e.path: e for e in entries if hasattr(e, "size")}
    folders = {e.path for e in entries if not hasattr(e, "size")}
    assert files.keys() == expected.keys()
    assert {"data", "meta", "videos", "videos/observation.images.top/chunk-000"} <= folders
    for path, entry in files.items():
        assert entry.size == len(expected[path])
        if path.endswith((".parquet", ".mp4")):
            assert entry.lfs is not None and entry.lfs.sha256 == hashlib.sha256(expected[path]).hexdigest()
            assert re.fullmatch(r"[0-9a-f]{64}", entry.xet_hash or "") and entry.xet_hash != entry.lfs.sha256
        else:  # small text stays in git: the oid is the git blob sha1 of the content
            git = hashlib.sha1(b"blob %d\0" % len(expected[path]) + expected[path]).hexdigest()
            assert entry.lfs is None and entry.xet_hash is None and entry.blob_id == git


def test_list_repo_tree_pages_through_link_headers(loopback_hub: LoopbackHub, small_dataset: Path) -> None:
    loopback_hub.add_dataset(REPO_ID, small_dataset)
    loopback_hub.commit_files(REPO_ID, {f"many/{i:04d}.txt": b"x" for i in range(1100)})
    tree = HfApi(endpoint=loopback_hub.endpoint).list_repo_tree(REPO_ID, "many", repo_type="dataset")
    assert [e.path for e in tree] == [f"many/{i:04d}.txt" for i in range(1100)]
    pages = [r for r in loopback_hub.records if "/tree/" in r.path]
    assert len(pages) == 2 and "cursor=1000" in pages[1].query


def test_get_paths_info_returns_files_and_folders_and_skips_missing(served: tuple[LoopbackHub, str]) -> None:
    hub, sha = served
    infos = HfApi(endpoint=hub.endpoint).get_paths_info(
        REPO_ID, [VIDEO, "meta", "missing.txt"], repo_type="dataset", revision=sha, expand=True
    )
    by_path = {i.path: i for i in infos}
    assert by_path.keys() == {VIDEO, "meta"}
    assert by_path[VIDEO].lfs is not None and by_path[VIDEO].last_commit.oid == sha  # type: ignore[union-attr]
    assert [r.method for r in hub.records if "/paths-info/" in r.path] == ["POST"]


def test_hf_hub_download_at_a_sha_returns_the_file(
    served: tuple[LoopbackHub, str], small_dataset: Path, tmp_path: Path
) -> None:
    hub, sha = served
    for path in (DATA, INFO):
        local = hf_hub_download(
            REPO_ID, path, repo_type="dataset", revision=sha, endpoint=hub.endpoint, cache_dir=tmp_path
        )
        assert Path(local).read_bytes() == (small_dataset / path).read_bytes()
    assert {r.repo_revision for r in hub.records if r.origin == "hub" and "/resolve/" in r.path} == {sha}


def test_errors_map_to_the_client_exceptions(served: tuple[LoopbackHub, str], tmp_path: Path) -> None:
    hub, sha = served
    api = HfApi(endpoint=hub.endpoint)
    with pytest.raises(RepositoryNotFoundError):
        api.repo_info("nobody/nothing", repo_type="dataset")
    with pytest.raises(RevisionNotFoundError):
        api.repo_info(REPO_ID, repo_type="dataset", revision="no-such-branch")
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(
            REPO_ID,
            "missing.bin",
            repo_type="dataset",
            revision=sha,
            endpoint=hub.endpoint,
            cache_dir=tmp_path,
        )
    with pytest.raises(BucketNotFoundError):
        api.bucket_info("nobody/nothing")


def test_hffs_range_read_follows_the_302_without_leaking_auth(
    served: tuple[LoopbackHub, str], small_dataset: Path
) -> None:
    hub, sha = served
    fs = HfFileSystem(endpoint=hub.endpoint, token="hf_secret_for_loopback", skip_instance_cache=True)
    hub.clear_records()
    with fs.open(f"datasets/{REPO_ID}@{sha}/{VIDEO}", "rb", cache_type="none") as file:
        file.seek(1000)
        data = file.read(4096)
    assert data == (small_dataset / VIDEO).read_bytes()[1000:5096]
    hub_read, cdn_read = hub.range_reads()
    assert (hub_read.origin, hub_read.status, hub_read.bytes_sent) == ("hub", 302, 0)
    assert (cdn_read.origin, cdn_read.status, cdn_read.bytes_sent) == ("cdn", 206, 4096)
    assert hub_read.range == cdn_read.range == "bytes=1000-5095"
    assert hub_read.authorization and not cdn_read.authorization
    assert hub.bytes_sent() >= 4096


def test_sidecar_branch_upload_leaves_main_untouched(served: tuple[LoopbackHub, str]) -> None:
    hub, sha = served
    api = HfApi(endpoint=hub.endpoint)
    api.create_branch(REPO_ID, repo_type="dataset", branch="lerobot-sidecars")
    api.create_branch(REPO_ID, repo_type="dataset", branch="lerobot-sidecars", exist_ok=True)  # 409 swallowed
    info = api.upload_file(
        path_or_fileobj=b"sidecar bytes",
        path_in_repo="sidecars/index.bin",
        repo_id=REPO_ID,
        repo_type="dataset",
        revision="lerobot-sidecars",
    )
    assert info.oid == hub.branch_head(REPO_ID, "lerobot-sidecars") != sha
    assert hub.branch_head(REPO_ID, "main") == sha
    fs = HfFileSystem(endpoint=hub.endpoint, skip_instance_cache=True)
    assert fs.cat_file(f"datasets/{REPO_ID}@lerobot-sidecars/sidecars/index.bin") == b"sidecar bytes"
    assert not fs.exists(f"datasets/{REPO_ID}@main/sidecars/index.bin")
    with pytest.raises(RevisionNotFoundError):
        api.upload_file(
            path_or_fileobj=b"x", path_in_repo="x", repo_id=REPO_ID, repo_type="dataset", revision="no-branch"
        )


def test_bucket_info_tree_and_read(loopback_hub: LoopbackHub, small_dataset: Path) -> None:
    loopback_hub.add_bucket(BUCKET_ID, small_dataset)
    expected = _files(small_dataset)
    api = HfApi(endpoint=loopback_hub.endpoint)
    info = api.bucket_info(BUCKET_ID)
    assert (info.id, info.total_files, info.size) == (
        BUCKET_ID,
        len(expected),
        sum(map(len, expected.values())),
    )
    tree = {e.path: e for e in api.list_bucket_tree(BUCKET_ID, recursive=True)}
    assert tree.keys() == expected.keys()
    assert all(re.fullmatch(r"[0-9a-f]{64}", e.xet_hash) and e.mtime and e.uploaded_at for e in tree.values())
    top = {(e.type, e.path) for e in api.list_bucket_tree(BUCKET_ID)}
    assert top == {("directory", "data"), ("directory", "meta"), ("directory", "videos")}
    assert [p.path for p in api.get_bucket_paths_info(BUCKET_ID, [INFO, "missing"])] == [INFO]

    fs = HfFileSystem(endpoint=loopback_hub.endpoint, skip_instance_cache=True)
    with fs.open(f"hf://buckets/{BUCKET_ID}/{VIDEO}", "rb", cache_type="none") as file:
        file.seek(10)
        assert file.read(100) == expected[VIDEO][10:110]
    assert [r.origin for r in loopback_hub.range_reads()] == ["hub", "cdn"]


def test_put_bucket_object_changes_xet_hash_of_same_size_content(
    loopback_hub: LoopbackHub, small_dataset: Path
) -> None:
    loopback_hub.add_bucket(BUCKET_ID, small_dataset)
    api = HfApi(endpoint=loopback_hub.endpoint)
    before = next(iter(api.get_bucket_paths_info(BUCKET_ID, [INFO])))
    loopback_hub.put_bucket_object(BUCKET_ID, INFO, b"y" * before.size)
    after = next(iter(api.get_bucket_paths_info(BUCKET_ID, [INFO])))
    assert after.size == before.size and after.xet_hash != before.xet_hash
    fs = HfFileSystem(endpoint=loopback_hub.endpoint, skip_instance_cache=True)
    with fs.open(f"hf://buckets/{BUCKET_ID}/{INFO}", "rb", cache_type="none") as file:
        assert file.read(3) == b"yyy"


def test_commit_deletions_and_stale_parent(served: tuple[LoopbackHub, str]) -> None:
    hub, sha = served
    api = HfApi(endpoint=hub.endpoint)
    api.delete_file(INFO, REPO_ID, repo_type="dataset")
    api.delete_folder("videos", REPO_ID, repo_type="dataset")
    remaining = api.list_repo_files(REPO_ID, repo_type="dataset")
    assert INFO not in remaining and not [p for p in remaining if p.startswith("videos/")]
    assert INFO in api.list_repo_files(REPO_ID, repo_type="dataset", revision=sha)  # history is kept
    with pytest.raises(HfHubHTTPError) as stale:
        api.upload_file(
            path_or_fileobj=b"x", path_in_repo="x", repo_id=REPO_ID, repo_type="dataset", parent_commit=sha
        )
    assert stale.value.response.status_code == 412
    assert len(api.list_repo_commits(REPO_ID, repo_type="dataset")) == 3


# ----------------------------------------------------------------------------- HTTP semantics (urllib3)


def test_range_semantics(
    served: tuple[LoopbackHub, str], small_dataset: Path, http: urllib3.PoolManager
) -> None:
    hub, sha = served
    video = (small_dataset / VIDEO).read_bytes()
    size = len(video)
    cdn = _cdn_url(hub, http, sha, VIDEO)
    regular = _resolve_url(hub, sha, INFO)  # small text: served by the hub itself, no redirect
    for url, content in ((cdn, video), (regular, (small_dataset / INFO).read_bytes())):
        n = len(content)
        part = http.request("GET", url, headers={"Range": "bytes=10-19"})
        assert (part.status, part.data, part.headers["Content-Range"]) == (
            206,
            content[10:20],
            f"bytes 10-19/{n}",
        )
        tail = http.request("GET", url, headers={"Range": f"bytes={n - 5}-"})
        assert (tail.status, tail.data) == (206, content[-5:])
        clamped = http.request("GET", url, headers={"Range": f"bytes={n - 3}-{n + 100}"})
        assert clamped.headers["Content-Range"] == f"bytes {n - 3}-{n - 1}/{n}"
        past = http.request("GET", url, headers={"Range": f"bytes={n}-"})
        assert (past.status, past.headers["Content-Range"]) == (416, f"bytes */{n}")
        whole = http.request("GET", url)
        assert (whole.status, whole.data, whole.headers["Accept-Ranges"]) == (200, content, "bytes")
    head = http.request("HEAD", _resolve_url(hub, "main", VIDEO), redirect=False)
    assert head.status == 302 and head.headers["X-Repo-Commit"] == sha
    assert head.headers["X-Linked-Size"] == str(size)
    assert head.headers["X-Linked-Etag"].strip('"') == hashlib.sha256(video).hexdigest()
    missing = http.request("GET", _resolve_url(hub, "main", "nope.bin"))
    assert (missing.status, missing.headers["X-Error-Code"], missing.headers["X-Repo-Commit"]) == (
        404,
        "EntryNotFound",
        sha,
    )


def test_redirect_off_serves_lfs_payloads_directly(
    make_loopback_hub: HubFactory, small_dataset: Path, http: urllib3.PoolManager
) -> None:
    hub = make_loopback_hub(redirect=False)
    sha = hub.add_dataset(REPO_ID, small_dataset)
    answer = http.request("GET", _resolve_url(hub, sha, VIDEO), headers={"Range": "bytes=0-99"})
    assert answer.status == 206 and answer.data == (small_dataset / VIDEO).read_bytes()[:100]
    assert {r.origin for r in hub.records} == {"hub"}


@pytest.mark.parametrize("kind", ["503", "429", "reset", "close", "short", "stall"])
def test_fault_kinds_as_the_client_sees_them(
    kind: str, served: tuple[LoopbackHub, str], http: urllib3.PoolManager
) -> None:
    hub, sha = served
    url = _cdn_url(hub, http, sha, VIDEO)  # no Range header: not counted, never faulted
    hub.stall_s = 0.8
    hub.fault_kinds = [kind]
    hub.fault_every = 1
    request = {"headers": {"Range": "bytes=0-9999"}, "timeout": urllib3.Timeout(connect=2.0, read=0.3)}
    if kind in ("503", "429"):
        answer = http.request("GET", url, **request)
        assert (answer.status, answer.headers["Retry-After"]) == (int(kind), "0")
    elif kind == "stall":
        with pytest.raises(ReadTimeoutError):
            http.request("GET", url, **request)
    else:
        with pytest.raises(ProtocolError) as raised:
            http.request("GET", url, **request)
        # reset: an RST; close: a FIN before any answer; short: 206 headers, then half the body.
        cause = {"reset": ConnectionResetError, "close": RemoteDisconnected, "short": IncompleteRead}[kind]
        assert isinstance(raised.value.args[1], cause), raised.value
    hub.fault_every = 0
    assert http.request("GET", url, **request).status == 206  # the next read is healthy again
    deadline = time.monotonic() + 5.0  # a stalled answer is recorded once its handler wakes up
    while len(hub.range_reads()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    faulted = [r for r in hub.range_reads() if r.fault]
    assert [r.fault for r in faulted] == [kind]
    if kind == "short":
        assert (faulted[0].status, faulted[0].bytes_sent) == (206, 5000)


def test_faults_rotate_over_range_reads_of_both_origins(
    served: tuple[LoopbackHub, str], http: urllib3.PoolManager
) -> None:
    hub, sha = served
    hub.fault_kinds = ["503", "429"]
    hub.fault_every = 2
    statuses = []
    for _ in range(3):  # each read: hub resolve (302) then CDN (206), both with Range
        answer = http.request("GET", _resolve_url(hub, sha, VIDEO), headers={"Range": "bytes=0-9"})
        statuses.append(answer.status)
        if answer.status == 302:
            statuses.append(
                http.request("GET", answer.headers["Location"], headers={"Range": "bytes=0-9"}).status
            )
    assert statuses == [302, 503, 302, 429, 302, 503]
    assert [r.fault for r in hub.range_reads()] == [None, "503", None, "429", None, "503"]


def test_a_short_body_due_on_a_redirect_goes_to_the_next_range_read(
    served: tuple[LoopbackHub, str], http: urllib3.PoolManager
) -> None:
    hub, sha = served
    hub.fault_kinds = ["short"]
    hub.fault_every = 2
    first = http.request("GET", _resolve_url(hub, sha, VIDEO), headers={"Range": "bytes=0-9"}, redirect=False)
    second = http.request("GET", _resolve_url(hub, sha, VIDEO), headers={"Range": "bytes=0-9"}, redirect=False)
    assert (first.status, second.status) == (302, 302)  # the second was due a short body: a redirect has none
    with pytest.raises(ProtocolError):
        http.request("GET", second.headers["Location"], headers={"Range": "bytes=0-9999"}, retries=False)
    assert [r.fault for r in hub.range_reads()] == [None, None, "short"]


def test_expired_signed_urls_answer_403_until_resolved_again(
    served: tuple[LoopbackHub, str], http: urllib3.PoolManager
) -> None:
    hub, sha = served
    old = _cdn_url(hub, http, sha, VIDEO)
    assert http.request("GET", old, headers={"Range": "bytes=0-9"}).status == 206
    hub.expire_signed_urls()
    assert http.request("GET", old, headers={"Range": "bytes=0-9"}).status == 403
    fresh = _cdn_url(hub, http, sha, VIDEO)
    assert fresh != old and http.request("GET", fresh, headers={"Range": "bytes=0-9"}).status == 206


def test_signed_urls_expire_after_their_ttl(
    make_loopback_hub: HubFactory, small_dataset: Path, http: urllib3.PoolManager
) -> None:
    hub = make_loopback_hub(signed_url_ttl_s=0.2)
    sha = hub.add_dataset(REPO_ID, small_dataset)
    url = _cdn_url(hub, http, sha, VIDEO)
    assert http.request("GET", url).status == 200
    time.sleep(0.3)
    assert http.request("GET", url).status == 403


def test_hidden_files_answer_entry_not_found_until_unhidden(
    served: tuple[LoopbackHub, str], http: urllib3.PoolManager
) -> None:
    hub, sha = served
    signed_before = _cdn_url(hub, http, sha, VIDEO)
    hub.hide(VIDEO)
    for url in (_resolve_url(hub, sha, VIDEO), signed_before):
        answer = http.request("GET", url, headers={"Range": "bytes=0-9"}, redirect=False)
        assert (answer.status, answer.headers["X-Error-Code"]) == (404, "EntryNotFound")
    assert (
        http.request("GET", _resolve_url(hub, sha, DATA), redirect=False).status == 302
    )  # others unaffected
    tree = HfApi(endpoint=hub.endpoint).list_repo_tree(REPO_ID, repo_type="dataset", recursive=True)
    assert VIDEO in {e.path for e in tree}  # it vanished after the listing
    hub.unhide(VIDEO)
    assert http.request("GET", signed_before, headers={"Range": "bytes=0-9"}).status == 206


def test_require_token(make_loopback_hub: HubFactory, small_dataset: Path, http: urllib3.PoolManager) -> None:
    hub = make_loopback_hub(require_token="hf_loopback_token")
    sha = hub.add_dataset(REPO_ID, small_dataset)
    assert http.request("GET", f"{hub.endpoint}/api/datasets/{REPO_ID}").status == 401
    wrong = http.request("GET", _resolve_url(hub, sha, VIDEO), headers={"Authorization": "Bearer hf_wrong"})
    assert wrong.status == 401 and b"hf_wrong" not in wrong.data
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.endpoint, token=False).repo_info(REPO_ID, repo_type="dataset")
    fs = HfFileSystem(endpoint=hub.endpoint, token="hf_loopback_token", skip_instance_cache=True)
    with fs.open(f"datasets/{REPO_ID}@{sha}/{VIDEO}", "rb", cache_type="none") as file:
        assert file.read(10) == (small_dataset / VIDEO).read_bytes()[:10]
    resolve, cdn = hub.range_reads()
    assert (resolve.status, resolve.authorization) == (302, True)
    assert (cdn.origin, cdn.status, cdn.authorization) == ("cdn", 206, False)
    assert all(b"hf_loopback_token" not in json.dumps(r.__dict__).encode() for r in hub.records)


def test_latency_applies_to_every_request(make_loopback_hub: HubFactory, http: urllib3.PoolManager) -> None:
    hub = make_loopback_hub(latency_s=0.15)
    started = time.monotonic()
    assert http.request("GET", f"{hub.endpoint}/api/agent-harnesses").status == 404
    assert time.monotonic() - started >= 0.15
    hub.latency_s = 0.0  # changeable at runtime
    assert http.request("GET", f"{hub.cdn_endpoint}/expired/x").status == 403


def test_write_requests_count_writes_but_not_paths_info(
    served: tuple[LoopbackHub, str], small_dataset: Path, http: urllib3.PoolManager
) -> None:
    hub, _ = served
    hub.add_bucket(BUCKET_ID, small_dataset)
    api = HfApi(endpoint=hub.endpoint)
    api.get_paths_info(REPO_ID, [INFO], repo_type="dataset")
    list(api.get_bucket_paths_info(BUCKET_ID, [INFO]))
    assert hub.write_requests() == []
    api.create_branch(REPO_ID, repo_type="dataset", branch="lerobot-sidecars")
    api.upload_file(
        path_or_fileobj=b"s",
        path_in_repo="s.bin",
        repo_id=REPO_ID,
        repo_type="dataset",
        revision="lerobot-sidecars",
    )
    # Bucket writes need Xet: they are refused with 501 (never a retried 5xx), but still recorded.
    batch = http.request("POST", f"{hub.endpoint}/api/buckets/{BUCKET_ID}/batch", body=b"{}")
    token = http.request("GET", f"{hub.endpoint}/api/buckets/{BUCKET_ID}/xet-write-token")
    assert batch.status == token.status == 501
    assert [(r.method, r.path) for r in hub.write_requests()] == [
        ("POST", f"/api/datasets/{REPO_ID}/branch/lerobot-sidecars"),
        ("POST", f"/api/datasets/{REPO_ID}/preupload/lerobot-sidecars"),
        ("POST", f"/api/datasets/{REPO_ID}/commit/lerobot-sidecars"),
        ("POST", f"/api/buckets/{BUCKET_ID}/batch"),
        ("GET", f"/api/buckets/{BUCKET_ID}/xet-write-token"),
    ]


def test_stop_ends_keepalive_and_stalled_connections(
    served: tuple[LoopbackHub, str], http: urllib3.PoolManager
) -> None:
    hub, sha = served
    assert http.request("GET", f"{hub.endpoint}/api/datasets/{REPO_ID}").status == 200  # kept alive
    hub.stall_s = 30.0
    hub.fault_kinds = ["stall"]
    hub.fault_every = 1
    outcome: list[BaseException] = []

    def stalled_read() -> None:
        try:
            http.request("GET", _resolve_url(hub, sha, INFO), headers={"Range": "bytes=0-9"})
        except Exception as error:
            outcome.append(error)

    stalled = threading.Thread(target=stalled_read, daemon=True)
    stalled.start()
    deadline = time.monotonic() + 5.0
    while not any(t.name == "loopback-hub-hub-connection" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the stalled request never reached the hub"
        time.sleep(0.01)
    time.sleep(0.1)  # let it reach the stall
    started = time.monotonic()
    hub.stop()
    assert time.monotonic() - started < 5.0
    assert not [t for t in threading.enumerate() if t.name.startswith("loopback-hub-")]
    stalled.join(5.0)
    assert len(outcome) == 1 and isinstance(outcome[0], ProtocolError), outcome


# ----------------------------------------------------------------------------- command line


def test_cli_demo_serves_until_sigterm(hub_client_env: None, http: urllib3.PoolManager) -> None:
    command = [sys.executable, "-m", "lerobot_nodes.testing.hub", "--demo", "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(60)
        assert lines and lines[0], "the hub printed nothing"
        match = re.search(
            r"HF_ENDPOINT=(http://127\.0\.0\.1:\d+) HF_HUB_DISABLE_XET=1 lerobot-nodes stream", lines[0]
        )
        assert match and "--dataset.repo_id=lerobot-nodes/demo" in lines[0], lines[0]
        answer = http.request("GET", f"{match[1]}/api/datasets/lerobot-nodes/demo")
        assert answer.status == 200 and answer.json()["id"] == "lerobot-nodes/demo"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        with pytest.raises(ProcessLookupError):  # nothing left in its process group: no orphan
            os.killpg(process.pid, 0)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
