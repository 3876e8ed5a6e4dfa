"""Byte sources: the only way readers reach dataset files."""

from __future__ import annotations

from .base import ByteRange, ByteSource, FileInfo, ReadStats
from .fsspec_source import FsspecSource
from .http_range import HttpOptions, HttpRangeReader
from .http_root import HttpRootSource
from .hub import HubBucketSource, HubRepoSource
from .local import LocalSource
from .range_cache import ByteRangeCache
from .resolve import open_source, register_scheme
from .s3 import S3Source

__all__ = [
    "ByteRange",
    "ByteRangeCache",
    "ByteSource",
    "FileInfo",
    "FsspecSource",
    "HttpOptions",
    "HttpRangeReader",
    "HttpRootSource",
    "HubBucketSource",
    "HubRepoSource",
    "LocalSource",
    "ReadStats",
    "S3Source",
    "open_source",
    "register_scheme",
]
