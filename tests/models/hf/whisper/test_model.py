"""The Whisper network against transformers' own, on a tiny random model transformers built."""

from __future__ import annotations

import copy

import pytest
import torch

from .conftest import h

TOKENS = [[50258, 50259, 50359, 50363, 100, 2000, 300, 7], [50258, 50259, 50359, 50363, 5, 60, 700, 8000]]


@pytest.fixture(scope="module")
def mel():
    torch.manual_seed(1)
    return torch.randn(2, 80, 3000)


def _ours_logits(model, mel, tokens):
    enc, _ = model.encode_offline(mel.transpose(1, 2))
    return enc, model.decoder(tokens, enc)


def test_logits_match_transformers(tiny, hf_model, mel):
    tokens = torch.tensor(TOKENS)
    with torch.no_grad():
        ref = hf_model(input_features=mel, decoder_input_ids=tokens)
        ref_enc = hf_model.model.encoder(mel).last_hidden_state
        enc, logits = _ours_logits(tiny.model, mel, tokens)
    # float32: both sides round differently; their gap is that of transformers' own fp32 vs fp64 error
    scale = ref.logits.abs().max()
    assert (logits - ref.logits).abs().max() <= 1e-4 * scale
    assert (enc - ref_enc).abs().max() <= 1e-4 * ref_enc.abs().max()


def test_logits_match_transformers_in_float64(tiny, hf_model, mel):
    """In float64 rounding vanishes: the two computations are the same function."""
    ours, ref_model = copy.deepcopy(tiny.model).double(), copy.deepcopy(hf_model).double()
    tokens = torch.tensor(TOKENS)
    with torch.no_grad():
        ref = ref_model(input_features=mel.double(), decoder_input_ids=tokens).logits
        _, logits = _ours_logits(ours, mel.double(), tokens)
    assert (logits - ref).abs().max() < 1e-9


def test_incremental_steps_equal_the_full_pass(tiny, mel):
    decoder = tiny.model.decoder
    tokens = torch.tensor(TOKENS)
    with torch.no_grad():
        enc, full = _ours_logits(tiny.model, mel, tokens)
        state, hidden = decoder.prefill(enc, tokens[:, :4])
        steps = [decoder.logits(hidden[:, -1])]
        for j in range(4, tokens.shape[1]):
            steps.append(decoder.step(state, tokens[:, j]))
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 3:], rtol=1e-4, atol=1e-4 * full.abs().max())


def test_rows_of_different_prompt_lengths_decode_together(tiny, mel):
    """Right-padded prompts of different lengths, stepped in one batch, equal each row run alone."""
    decoder = tiny.model.decoder
    prompts = [[50258, 50259, 50359, 50363], [50361, 11, 22, 33, 50258, 50259, 50359, 50363]]
    nxt = [[440, 441, 442], [1000, 1001, 1002]]
    with torch.no_grad():
        enc, _ = tiny.model.encode_offline(mel.transpose(1, 2))
        tokens = torch.zeros(2, 8, dtype=torch.long)
        for i, p in enumerate(prompts):
            tokens[i, : len(p)] = torch.tensor(p)
        lengths = torch.tensor([len(p) for p in prompts])
        state, hidden = decoder.prefill(enc, tokens, lengths)
        batched = [decoder.logits(hidden[torch.arange(2), lengths - 1])]
        for j in range(3):
            batched.append(decoder.step(state, torch.tensor([nxt[0][j], nxt[1][j]])))
        for i in range(2):
            alone = decoder(torch.tensor([prompts[i] + nxt[i]]), enc[i:i + 1])[0, len(prompts[i]) - 1:]
            got = torch.stack([b[i] for b in batched])
            torch.testing.assert_close(got, alone, rtol=1e-4, atol=1e-4 * alone.abs().max())


def test_select_expands_and_reorders_rows(tiny, mel):
    decoder = tiny.model.decoder
    tokens = torch.tensor(TOKENS)[:, :4]
    with torch.no_grad():
        enc, _ = tiny.model.encode_offline(mel.transpose(1, 2))
        state, _ = decoder.prefill(enc, tokens)
        picked = decoder.select(state, [1, 1, 0])  # repeats and a reorder, as beam search does
        assert picked.cross_k[0].shape[0] == 2  # cross-attention K/V stay one per request
        step = decoder.step(picked, torch.tensor([10, 11, 12]))
        ref = decoder(torch.cat([tokens[[1, 1, 0]], torch.tensor([[10], [11], [12]])], 1), enc[[1, 1, 0]])[:, -1]
        torch.testing.assert_close(step, ref, rtol=1e-4, atol=1e-4 * ref.abs().max())
        # dropping request 0's rows drops its cross-attention entry too
        only = decoder.select(picked, [0, 1])
        assert only.cross_k[0].shape[0] == 1 and only.cross_group == 2


def test_merge_joins_two_prefills(tiny, mel):
    decoder = tiny.model.decoder
    tokens = torch.tensor(TOKENS)
    with torch.no_grad():
        enc, _ = tiny.model.encode_offline(mel.transpose(1, 2))
        a, _ = decoder.prefill(enc[:1], tokens[:1, :4])
        b, _ = decoder.prefill(enc[1:], tokens[1:, :6])
        assert decoder.can_merge(a, b)
        merged = decoder.merge(a, b)
        got = decoder.step(merged, torch.tensor([tokens[0, 4], tokens[1, 6]]))
        ref = torch.stack([decoder(tokens[:1, :5], enc[:1])[0, -1], decoder(tokens[1:, :7], enc[1:])[0, -1]])
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4 * ref.abs().max())


def test_cross_attention_matches_transformers_attentions(tiny, hf_model, mel):
    tokens = torch.tensor(TOKENS)
    heads = [(1, 0), (0, 3), (1, 2)]
    with torch.no_grad():
        hf_model.set_attn_implementation("eager")  # sdpa returns no attention probabilities
        try:
            out = hf_model(input_features=mel, decoder_input_ids=tokens, output_attentions=True)
        finally:
            hf_model.set_attn_implementation("sdpa")
        enc, _ = tiny.model.encode_offline(mel.transpose(1, 2))
        probs, logits = tiny.model.decoder.cross_attention(enc, tokens, heads)
    ref = torch.stack([out.cross_attentions[layer][:, head] for layer, head in heads], dim=1)
    torch.testing.assert_close(probs, ref, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(logits, out.logits, rtol=1e-4, atol=1e-4 * out.logits.abs().max())
    # logits=False: the final hidden states instead, which project to the same logits (word timing projects a
    # block of rows at a time)
    with torch.no_grad():
        same, hidden = tiny.model.decoder.cross_attention(enc, tokens, heads, logits=False)
        projected = tiny.model.decoder.logits(hidden)
    assert hidden.shape == (*tokens.shape, tiny.model.config.d_model)
    torch.testing.assert_close(same, probs)
    torch.testing.assert_close(projected, logits, rtol=1e-5, atol=1e-5 * logits.abs().max())
    # a truncated frame range renormalizes over the frames kept (openai-whisper's word timing input)
    with torch.no_grad():
        cut, _ = tiny.model.decoder.cross_attention(enc, tokens, heads, max_frames=100)
    assert cut.shape[-1] == 100
    torch.testing.assert_close(cut.sum(-1), torch.ones_like(cut.sum(-1)))


def test_encoder_refuses_more_than_one_window(tiny):
    from oasr.errors import CapabilityError

    with pytest.raises(CapabilityError, match="30 s"):
        tiny.model.encode_offline(torch.zeros(1, 3002, 80))


def test_the_output_projection_is_the_embedding(tiny):
    model = tiny.model
    assert model.decoder.proj_out.weight is model.decoder.embed_tokens.weight
    assert "decoder.proj_out.weight" not in model.native_state_dict()
    assert h.TINY_ALIGNMENT_HEADS == [list(x) for x in model.config.generation.alignment_heads]
