"""What the decoders of one worker share instead of each setting it up (open anchor runs, issue 24):
codec contexts of closed decoders, per-thread RGB converters, and on short GOPs one decoder that
reads each GOP ahead and serves every open run; a decoder of a stranded run keeps the frames it passed.
None of it changes a frame."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lerobot_nodes.mp4 import Clip, ClipDecoder, DecodedFrameBudget, read_index
from lerobot_nodes.mp4.decode import REORDER_FRAMES, CodecContextPool, frames_to_keep, reads_ahead
from lerobot_nodes.mp4.plan import gop_starts, plan_clip
from lerobot_nodes.nodes.decode_mapper import DecoderLRU
from lerobot_nodes.nodes.pool_sampler import STRAND_STRIDE, interleave_runs, strand_reach, strand_run
from lerobot_nodes.sources import LocalSource

from .mp4_media import decoded_frames


def _setup(videos, variant):
    path = videos[variant]
    index = read_index(path)
    reference = decoded_frames(path)
    presented = sorted(reference)
    span = (presented[0] / index.timescale, (presented[-1] + index.frame_duration) / index.timescale)
    plan = plan_clip(index, *span)
    data = LocalSource(path.parent).read_ranges(path.name, plan.byte_ranges)
    from lerobot_nodes.mp4 import materialize_clip

    clip = Clip(materialize_clip(plan, data), plan.layout)
    starts = gop_starts(index, *span).tolist()
    bounds = [*starts, len(presented)]
    runs = [np.asarray(presented[bounds[i] : bounds[i + 1]]) for i in range(len(starts))]
    return index, plan, clip, reference, runs


def _hwc(frames: torch.Tensor) -> np.ndarray:
    return frames[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("variant", ["av1", "av1_starts_at_2"])
@pytest.mark.parametrize("open_runs", [2, 4, 8])
def test_one_decoder_reading_ahead_serves_interleaved_short_gop_runs(videos, variant, open_runs):
    index, plan, clip, reference, runs = _setup(videos, variant)
    assert reads_ahead(clip.layout)
    order = interleave_runs([runs[i] for i in np.random.default_rng(open_runs).permutation(len(runs))], open_runs)
    decoder = ClipDecoder(clip, frame_cache_size=open_runs * 2, read_ahead=True, context_pool=CodecContextPool(4))
    assert decoder.reads_ahead
    for pts in order.tolist():
        frame = _hwc(decoder.frames_at([pts / index.timescale]))
        np.testing.assert_array_equal(frame, reference[pts], err_msg=f"pts {pts}")
    assert decoder.samples_decoded == plan.sample_count  # each packet once, one decoder for all runs


@pytest.mark.parametrize("variant", ["h264", "h264_g2", "h264_open_gop", "av1_g32", "hevc_g2"])
def test_only_short_gops_without_reordering_read_ahead(videos, variant):
    _, _, clip, _, _ = _setup(videos, variant)
    assert not reads_ahead(clip.layout)
    assert not ClipDecoder(clip, read_ahead=True).reads_ahead


@pytest.mark.parametrize("variant", ["av1", "h264", "h264_open_gop", "hevc"])
def test_a_pooled_codec_context_decodes_what_a_new_one_does(videos, variant):
    index, _, clip, reference, _ = _setup(videos, variant)
    pool = CodecContextPool(4)
    presented = sorted(reference)
    rng = np.random.default_rng(1)
    for _ in range(4):
        decoder = ClipDecoder(clip, context_pool=pool)
        for pts in rng.choice(presented, size=12).tolist():
            np.testing.assert_array_equal(_hwc(decoder.frames_at([pts / index.timescale])), reference[pts])
        decoder.close()  # its context, drained or mid-GOP, goes back flushed
        assert len(pool) == 1
    assert pool.created == 1 and pool.taken == 3


def test_contexts_go_only_to_decoders_of_the_same_codec_configuration(videos):
    av1 = _setup(videos, "av1")
    h264 = _setup(videos, "h264")
    pool = CodecContextPool(4)
    first = ClipDecoder(h264[2], context_pool=pool)
    first.frames_at([sorted(h264[3])[0] / h264[0].timescale])
    first.close()
    second = ClipDecoder(av1[2], context_pool=pool)
    pts = sorted(av1[3])[5]
    np.testing.assert_array_equal(_hwc(second.frames_at([pts / av1[0].timescale])), av1[3][pts])
    assert pool.taken == 0 and pool.created == 2 and len(pool) == 1


def test_pool_keeps_at_most_its_limit():
    pool = CodecContextPool(2)
    import av

    for _ in range(5):
        pool.give("h264", b"x", av.CodecContext.create("h264", "r"))
    assert len(pool) == 2
    assert pool.take("h264", b"y") is None and pool.take("h264", b"x") is not None
    assert CodecContextPool(0).take("h264", b"x") is None


@pytest.mark.parametrize(("variant", "opened"), [("av1", 1), ("h264", 3)])
def test_decoder_lru_opens_one_decoder_per_short_gop_clip_and_reuses_contexts(videos, variant, opened):
    """AV1 g=2: one decoder per (episode, camera) whatever the open runs; H.264 GOP 30 (3 runs): one
    per open run. The second episode's decoders start on the first's codec contexts."""
    index, plan, clip, reference, runs = _setup(videos, variant)
    budget = DecodedFrameBudget(None)
    lru = DecoderLRU(64, frame_budget=budget, window_frames=1, per_key=4)
    order = interleave_runs(runs, 4)
    for epoch in range(2):
        for pts in order.tolist():
            at = pts / index.timescale
            slot, decoder = lru.checkout(epoch, "cam", clip, at)
            try:
                frame = _hwc(decoder.frames_at([at]))
            finally:
                lru.checkin(slot, decoder)
            np.testing.assert_array_equal(frame, reference[pts], err_msg=f"{variant} pts {pts}")
        lru.retire(epoch)
    assert lru.opened == 2 * opened
    assert lru.contexts.created == opened and lru.contexts.taken == opened
    lru.clear()
    assert len(lru.contexts) == 0


@pytest.mark.parametrize("variant", ["h264", "hevc", "h264_negative_cts"])
@pytest.mark.parametrize("ways", [2, 3])
def test_a_decoder_keeping_its_reach_serves_a_stranded_run_decoding_each_frame_once(videos, variant, ways):
    """A run read in strands (``strand_run``) asks for frames its decoder passed on the way to a later
    one: kept (``keep_ahead(strand_reach)``, dropped in decode order), each is decoded once, exactly as
    the run read forward; with only the frames a forward run keeps, the decoder goes back to the key
    frame for them."""
    index, _, clip, reference, runs = _setup(videos, variant)
    run = max(runs, key=len)
    assert len(run) >= ways * STRAND_STRIDE
    order = run[strand_run(np.arange(len(run)), ways)]
    kept = frames_to_keep(clip.layout, 1)

    def decode(times, reach, asked_once=False):
        budget = DecodedFrameBudget(None)
        decoder = ClipDecoder(clip, frame_cache_size=kept, frame_budget=budget, asked_once=asked_once)
        decoder.keep_ahead(reach)
        for pts in times:
            np.testing.assert_array_equal(_hwc(decoder.frames_at([pts / index.timescale])), reference[pts])
        return decoder, budget

    forward, _ = decode(run.tolist(), 0)
    reach = strand_reach(len(run), ways)
    stranded, kept_frames = decode(order.tolist(), reach)
    assert stranded.samples_decoded == forward.samples_decoded and stranded.restarts == forward.restarts
    assert decode(order.tolist(), 0)[0].samples_decoded > forward.samples_decoded
    # Asked once (camera windows of one frame): a frame returned is dropped, one passed waits its turn.
    once, held = decode(order.tolist(), reach, asked_once=True)
    assert once.samples_decoded == forward.samples_decoded and once.restarts == forward.restarts
    assert held.peak_frames <= reach + REORDER_FRAMES < kept_frames.peak_frames == kept + reach
