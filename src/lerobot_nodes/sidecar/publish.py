"""Publishing a verified, full-dataset sidecar archive where training looks for it (SPEC §4).

- Dataset repos: the ``lerobot-sidecars`` branch (created from the pinned commit when it does
  not exist; the source branch or tag is never touched), file
  ``meta/mp4-sidecars/mp4-sidecar-<commit>.npz``: one archive per source commit, so a tag
  and the commit it resolves to share it.
- Buckets: ``meta/mp4-sidecars/`` of the bucket itself.

Publishing is a maintainer's explicit action (``lerobot-build-mp4-sidecar --push``) and needs
write access; training never calls this module.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import PublishNotSupportedError
from ..sources import ByteSource, HubBucketSource, HubRepoSource
from ..sources.hub import PUBLISHED_SIDECAR_BRANCH, hf_api, hub_errors
from .schema import PUBLISHED_DIR


def published_name(source: ByteSource) -> str:
    """The archive's name in ``meta/mp4-sidecars/``: bound to the commit for dataset repos."""
    if isinstance(source, HubRepoSource):
        return f"mp4-sidecar-{source.sha}.npz"
    return "mp4-sidecar.npz"


def check_publishable(source: ByteSource) -> None:
    """Raise :class:`PublishNotSupportedError` (before any build) when ``source`` has nowhere to publish to."""
    if not isinstance(source, (HubRepoSource, HubBucketSource)):
        raise PublishNotSupportedError(
            f"--push publishes to a Hub dataset repo or bucket; {source.url} is neither: build without --push and "
            f"copy the verified archive to {PUBLISHED_DIR} of the dataset root yourself"
        )


def publish_archive(source: ByteSource, archive: str | Path) -> str:
    """Upload the verified ``archive`` of ``source``; returns where it went (for the summary)."""
    check_publishable(source)
    target = f"{PUBLISHED_DIR}{published_name(source)}"
    if isinstance(source, HubRepoSource):
        api = hf_api(source.endpoint, source.credentials)
        with hub_errors(f"publishing to {source.repo_id}@{PUBLISHED_SIDECAR_BRANCH}", source.endpoint):
            api.create_branch(source.repo_id, branch=PUBLISHED_SIDECAR_BRANCH, revision=source.sha,
                              repo_type="dataset", exist_ok=True)
            api.upload_file(
                path_or_fileobj=str(archive), path_in_repo=target, repo_id=source.repo_id, repo_type="dataset",
                revision=PUBLISHED_SIDECAR_BRANCH,
                commit_message=f"MP4 sidecar (schema v3) of commit {source.sha}",
            )
        return f"hf://datasets/{source.repo_id}@{PUBLISHED_SIDECAR_BRANCH}/{target}"
    assert isinstance(source, HubBucketSource)
    api = hf_api(source.endpoint, source.credentials)
    full = f"{source.prefix}/{target}" if source.prefix else target
    with hub_errors(f"publishing to bucket {source.bucket_id}", source.endpoint):
        api.batch_bucket_files(source.bucket_id, add=[(str(archive), full)])
    return f"hf://buckets/{source.bucket_id}/{full}"
