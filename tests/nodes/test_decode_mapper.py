"""DecodeMapper and its decoder LRU: parallel assembly, release of bytes, errors, threads."""

from __future__ import annotations

import threading

import pytest
import torch

from lerobot_nodes.errors import FrameTimestampError
from lerobot_nodes.nodes import BytePrefetcher, DecodeMapper, DecoderLRU, OrderedBuffer
from lerobot_nodes.nodes.decode_mapper import AssembledSample

from .helpers import lerobot_threads, make_sampler, wait_until
from .test_prefetcher import FakeFetch


class FakeDecoder:
    instances: list[FakeDecoder] = []

    def __init__(self, clip: bytes) -> None:
        self.clip = clip
        self.closed = False
        FakeDecoder.instances.append(self)

    def frames_at(self, timestamps_s, tolerance_s=1e-4, return_uint8=True):
        return torch.zeros(len(timestamps_s), 3, 2, 2)

    def close(self) -> None:
        self.closed = True


def test_decoder_lru_bounds_idle_decoders_and_retires_episodes():
    lru = DecoderLRU(capacity=2, factory=FakeDecoder)
    held = [lru.checkout(e, "cam", b"") for e in range(3)]
    for slot, decoder in held:
        lru.checkin(slot, decoder)
    assert len(lru) == 2 and held[0][1].closed and not held[2][1].closed
    slot, again = lru.checkout(2, "cam", b"")
    assert again is held[2][1]  # reused, not reopened
    # In use by another thread: that thread waits for it (one decoder per episode and camera,
    # so it keeps its position) instead of opening a second one.
    waited: list = []
    waiter = threading.Thread(target=lambda: waited.append(lru.checkout(2, "cam", b"")))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not waited
    other_decoder, _ = lru.checkout(1, "cam", b""), None  # other episodes are not held up
    lru.checkin(*other_decoder)
    lru.checkin(slot, again)
    waiter.join(5)
    assert waited and waited[0][1] is again
    lru.retire(2)
    lru.checkin(*waited[0])
    assert again.closed and len(lru) == 1
    lru.clear()
    assert len(lru) == 0


def _assemble_fail_on(frame_to_fail: int):
    def assemble(payload, frame, decoders):
        if payload.episode == 1 and frame == frame_to_fail:
            raise FrameTimestampError("One or several query timestamps unexpectedly violate the tolerance")
        return AssembledSample(sample={"episode": payload.episode, "frame": frame})

    return assemble


@pytest.mark.timeout(30)
def test_decode_errors_keep_their_type_and_name_the_episode_and_frame():
    sampler = make_sampler([0, 1, 2], [4, 4, 4], pool_size=1, shuffle=False)
    mapper = DecodeMapper(BytePrefetcher(sampler, FakeFetch()), _assemble_fail_on(2), num_threads=3)
    buffer = OrderedBuffer(mapper, max_ahead=4)
    got = []
    with pytest.raises(FrameTimestampError) as error:
        for sample in buffer:
            got.append((sample["episode"], sample["frame"]))
    assert "while assembling episode 1, frame 2" in "".join(getattr(error.value, "__notes__", []))
    assert all(e == 0 for e, _ in got[:4]) and (1, 2) not in got
    buffer.close()
    assert lerobot_threads() == []


@pytest.mark.timeout(30)
def test_every_sample_releases_its_episode_bytes():
    sampler = make_sampler(list(range(5)), [3] * 5, pool_size=2, costs={e: 10 for e in range(5)}, seed=1)
    mapper = DecodeMapper(BytePrefetcher(sampler, FakeFetch()), _assemble_fail_on(-1), num_threads=2)
    buffer = OrderedBuffer(mapper, max_ahead=3)
    assert len(list(buffer)) == 15
    cache = mapper.source.cache  # type: ignore[attr-defined]
    assert wait_until(lambda: cache.reserved_bytes == 0 and cache.resident_bytes == 0)
    assert cache.stats().episodes_fetched == 5
    buffer.reset()  # joins the decode threads, then the fetch threads
    assert not any(name.startswith("lerobot-nodes-decode") for name in lerobot_threads())
    assert len(list(buffer)) == 15
    buffer.close()
    assert lerobot_threads() == [] and threading.active_count() >= 1
