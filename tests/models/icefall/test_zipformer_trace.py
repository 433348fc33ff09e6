"""The traced Zipformer chunk step (``streaming.traced_step``) computes exactly what the eager
``streaming_forward`` computes, for cohorts and window lengths other than the one it was traced on,
and is not used where it must not be (autograd, training, switched off)."""

from __future__ import annotations

import pytest
import torch

from oasr_models_icefall.release import load_state_dict
from oasr_models_icefall.zipformer import streaming
from oasr_models_icefall.zipformer.convert import infer_zipformer_config
from oasr_models_icefall.zipformer.encoder import ZipformerEncoderModel, rel_shift

from .conftest import release_dir

CHUNK, LEFT_CHUNKS = 16, 4
WINDOW = 2 * CHUNK + 13


@pytest.fixture(scope="module")
def encoder(fixtures_dir):
    state = load_state_dict(release_dir(fixtures_dir, "zipformer_transducer_causal"))
    model = ZipformerEncoderModel(infer_zipformer_config(state))
    model.load_state_dict({k: v for k, v in state.items() if k.startswith(("encoder.", "encoder_embed."))})
    model.eval().prepare_streaming(CHUNK, LEFT_CHUNKS)
    return model


def test_one_trace_equals_eager_for_every_cohort_and_short_windows(encoder):
    left = encoder.stream_left_context
    generator = torch.Generator().manual_seed(0)
    warmed = streaming._TRACED.get(encoder, {}).get((WINDOW, left, torch.float32))
    with torch.inference_mode():
        first = torch.randn(1, WINDOW, 80, generator=generator)
        step = streaming.traced_step(encoder, first, torch.tensor([WINDOW]), encoder.init_stream_state(1), left)
        assert isinstance(step, torch.jit.ScriptModule)
        assert warmed is step  # made by prepare_streaming (engine construction), not by the first chunk
        for batch in (1, 3, 5):
            state_eager = state_traced = encoder.init_stream_state(batch)
            for chunk in range(6):  # past the left context: the processed-length mask changes, then saturates
                feats = torch.randn(batch, WINDOW, 80, generator=generator) * 2 - 5
                lens = torch.tensor([WINDOW - (row * 11 if chunk == 5 else 0) for row in range(batch)])
                eager = streaming.streaming_forward(encoder, feats, lens, state_eager, left)
                traced = encoder.forward_chunk_stateful(feats, state_traced, feat_lens=lens)
                assert streaming.traced_step(encoder, feats, lens, state_traced, left) is step
                assert torch.equal(traced[0], eager[0]) and torch.equal(traced[1], eager[1])
                assert len(traced[2]) == len(eager[2])
                assert all(torch.equal(a, b) for a, b in zip(traced[2], eager[2], strict=True))
                state_eager, state_traced = eager[2], traced[2]


def test_eager_where_a_trace_must_not_run(encoder):
    left = encoder.stream_left_context
    feats, lens = torch.zeros(1, WINDOW, 80), torch.tensor([WINDOW])
    state = encoder.init_stream_state(1)
    with torch.enable_grad():
        assert streaming.traced_step(encoder, feats, lens, state, left) is None
    with torch.no_grad():
        assert streaming.traced_step(encoder, feats, lens, state, left) is not None
        encoder.trace_chunk_step = False
        try:
            assert streaming.traced_step(encoder, feats, lens, state, left) is None
        finally:
            del encoder.trace_chunk_step
        encoder.train()
        try:
            assert streaming.traced_step(encoder, feats, lens, state, left) is None
        finally:
            encoder.eval()


def test_traced_rel_shift_keeps_a_dynamic_batch():
    """Under tracing (ONNX export) rel_shift gathers, so a graph traced at batch 1 shifts batch 3 right."""
    scores = torch.randn(4, 1, 8, 40 + 2 * 8 - 1)
    traced = torch.jit.trace(rel_shift, (scores,), check_trace=False)
    wide = torch.randn(4, 3, 8, 40 + 2 * 8 - 1)
    assert torch.equal(traced(wide), rel_shift(wide))
    assert torch.equal(traced(scores), rel_shift(scores))
