"""The decoder step's fast paths against their references: the timestamp rules (row slices) against
openai-whisper's ``ApplyTimestampRules``, and the stacked q/k/v projection against the three linears."""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import pytest
import torch

from oasr_models_hf.whisper.search import LogitRules


def _histories(ts: int, text: int) -> list[list[int]]:
    """Generated tokens that reach every branch of the rules: nothing yet, an open segment, a closed
    pair, text after a pair, decreasing candidates, and plain text."""
    return [[], [ts], [ts + 3, text], [ts, text, ts + 5], [ts, text, ts + 5, ts + 5], [ts + 2, text, text + 1],
            [text], [text, text + 1], [ts, text, ts + 7, text, text + 2], [ts + 4, ts + 4], [ts, text, ts + 9]]


#: -4: the best text logit beats the timestamps' log-sum-exp (about log(1501) + 0.5 - 4 against ~4.4 over 50k
#: normal logits), so "text is masked" depends on the best text logit, not on any other
@pytest.mark.parametrize("timestamp_boost", [-4.0, 0.0, 4.0])
def test_timestamp_rules_equal_openai_whisper(tiny, timestamp_boost):
    """Every row of one batch, each with its own history, is masked as openai-whisper's
    ApplyTimestampRules masks that row alone (the same -inf entries, the other logits untouched)."""
    from whisper.decoding import ApplyTimestampRules

    gen = attrs.evolve(tiny.config.generation, begin_suppress_tokens=())
    vocab = tiny.config.vocab_size
    ts, text = gen.timestamp_begin, 100
    histories = _histories(ts, text)
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(len(histories), vocab, generator=generator)
    logits[:, ts:] += timestamp_boost  # with the boost the timestamp mass outweighs the best text token
    rules = LogitRules(gen, vocab, logits.device)
    expected = logits.clone()
    expected[:, rules.suppress] = float("-inf")  # the suppression both sides apply before the rules
    tokenizer = SimpleNamespace(no_timestamps=gen.no_timestamps_id, timestamp_begin=ts, eot=gen.eot_id)
    reference = ApplyTimestampRules(tokenizer, 1, gen.max_initial_timestamp_index)
    for k, seq in enumerate(histories):
        row = expected[k:k + 1]
        reference.apply(row, torch.tensor([[gen.sot_id, *seq]]))
    ours = logits.clone()
    rules.apply(ours, histories, [True] * len(histories))
    assert torch.equal(torch.isinf(ours), torch.isinf(expected)), [
        k for k in range(len(histories)) if not torch.equal(torch.isinf(ours[k]), torch.isinf(expected[k]))]
    finite = ~torch.isinf(expected)
    assert torch.equal(ours[finite], expected[finite])
    text_masked = [bool(torch.isinf(expected[k, :ts]).all()) for k in range(len(histories))]
    assert any(text_masked) and not all(text_masked)  # both outcomes of the last rule are exercised


def test_stacked_self_attention_projection_follows_the_weights(tiny):
    """The stacked q/k/v copy equals the three projections, also after a weight changes in place."""
    decoder = tiny.model.decoder
    sa = decoder.layers[0].self_attn
    h = torch.randn(3, 5, tiny.config.d_model, generator=torch.Generator().manual_seed(0))

    def check():
        with torch.inference_mode():
            stacked = decoder._self_qkv(sa, h)
            separate = [sa.project(h, i) for i in range(3)]
        for got, want in zip(stacked, separate, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    check()
    saved = sa.q_proj.weight.detach().clone()
    try:
        with torch.no_grad():
            sa.q_proj.weight.mul_(2.0)
        check()
    finally:
        with torch.no_grad():
            sa.q_proj.weight.copy_(saved)
    check()
