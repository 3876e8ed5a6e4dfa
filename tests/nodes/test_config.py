"""StreamingConfig: SPEC section 5 defaults, validation and the per-worker splits."""

from __future__ import annotations

import pytest

from lerobot_nodes.config import StreamingConfig, resolve_seed
from lerobot_nodes.errors import ConfigError


def test_defaults_follow_the_spec():
    config = StreamingConfig()
    assert config.streaming_episode_pool_size is None
    assert config.streaming_sampling_strategy is None  # unset: round_robin for a new run, a checkpoint's on resume
    assert config.sampling_strategy == "round_robin"
    assert config.streaming_prefetch_episodes == 8
    assert config.streaming_byte_budget_gb == 8
    assert config.streaming_decode_threads == 2
    assert config.streaming_decoded_queue_size == 8
    assert config.video_decoder_cache_size is None
    assert config.streaming_native_http_connections is None
    assert config.streaming_native_http_subranges == 1
    assert config.streaming_sidecar_lock_timeout_s == 1800
    assert config.streaming_index_concurrency is None
    assert config.streaming_batches_across_workers is True
    assert config.max_num_shards == 16
    assert resolve_seed(None) == 42 and resolve_seed(7) == 7


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("streaming_episode_pool_size", 0, "streaming_episode_pool_size must be >= 1"),
        ("streaming_episode_pool_size", 2.5, "must be an integer"),
        ("streaming_sampling_strategy", "uniform", "must be one of remaining, round_robin"),
        ("streaming_prefetch_episodes", -1, "streaming_prefetch_episodes must be >= 0"),
        ("streaming_byte_budget_gb", 0, "streaming_byte_budget_gb must be a finite number > 0"),
        ("streaming_byte_budget_gb", float("inf"), "finite number"),
        ("streaming_decode_threads", 0, "streaming_decode_threads must be >= 1"),
        ("streaming_decoded_queue_size", 0, "streaming_decoded_queue_size must be >= 1"),
        ("video_decoder_cache_size", 0, "video_decoder_cache_size must be >= 1"),
        ("streaming_native_http_connections", 0, "streaming_native_http_connections must be >= 1"),
        ("streaming_native_http_subranges", 0, "streaming_native_http_subranges must be >= 1"),
        ("streaming_sidecar_lock_timeout_s", -1, "streaming_sidecar_lock_timeout_s"),
        ("max_num_shards", 0, "max_num_shards must be >= 1"),
        ("streaming_index_concurrency", 0, "^--dataset.streaming_index_concurrency must be >= 1, got 0$"),
        ("streaming_index_concurrency", 2.5, "streaming_index_concurrency must be an integer or unset"),
        ("streaming_decode_threads", True, "must be an integer"),
        ("streaming_batches_across_workers", "yes", "^--dataset.streaming_batches_across_workers must be true or false"),
    ],
)
def test_impossible_values_are_config_errors(field, value, message):
    with pytest.raises(ConfigError, match=message):
        StreamingConfig(**{field: value})


def test_per_rank_limits_are_split_over_workers():
    config = StreamingConfig(streaming_byte_budget_gb=2)
    assert config.rank_byte_budget == 2_000_000_000
    assert config.worker_byte_budget(4) == 500_000_000
    assert config.worker_byte_budget(0) == config.rank_byte_budget
    # Unset pool: the rank mixes 32 episodes, split as evenly as possible.
    assert [config.worker_pool_size(w, 3) for w in range(3)] == [11, 11, 10]
    assert config.worker_pool_size(0, 0) == 32
    assert [config.worker_pool_size(w, 40) for w in (0, 39)] == [1, 1]
    assert StreamingConfig(streaming_episode_pool_size=5).worker_pool_size(1, 4) == 5
    # Decoders: pool x cameras per worker by default, an explicit value is per rank.
    assert config.worker_decoder_cache_size(pool_size=8, num_cameras=3, num_workers=4) == 24
    assert StreamingConfig(video_decoder_cache_size=10).worker_decoder_cache_size(8, 3, 4) == 2
