"""Paraformer / BiCifParaformer against FunASR itself, on tiny random models FunASR builds.

Tensors are compared on the same features (FunASR's own frontend output, CMVN undone for OASR's
encoder, which applies ``am.mvn`` itself): encoder output, CIF alphas and embeddings, decoder
log-probs, all within 1e-4 of the reference's scale.  The reference runs each clip alone (FunASR's
batched predictor reads padded encoder frames, so its batched results depend on the batch); OASR runs
them all in one padded batch, which is therefore also checked against one-at-a-time.  Token ids and text are compared end to end —
OASR's frontend and engine against ``AutoModel.generate`` — where the reference's own decision is not
a near-tie (a top-2 log-prob gap or a token-count fraction below what the two frontends' float noise
can move).
"""

from __future__ import annotations

import pytest
import torch

import oasr
from tests.models.funasr import _helpers as h
from tests.models.funasr.conftest import VARIANTS

TOL = 1e-4
#: top-1 / top-2 log-prob gaps, and token-count distances from an integer, below this are near-ties
MARGIN = 1e-3


@pytest.fixture(scope="module")
def passes(references, clips):
    """Per variant, FunASR's pieces over each clip alone."""
    return {key: [h.reference_pass(ref, [audio]) for _, audio in clips] for key, ref in references.items()}


@pytest.fixture(scope="module")
def engines(model_dirs):
    return {key: oasr.Engine(oasr.EngineConfig(model=str(path))) for key, path in model_dirs.items()}


def _pad(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence([t[0] for t in tensors], batch_first=True)


@pytest.mark.parametrize("variant", VARIANTS, ids=["-".join(v) for v in VARIANTS])
def test_encoder_predictor_decoder_match_funasr_on_the_same_features(variant, engines, passes):
    model = engines[variant].model
    refs = passes[variant]
    feats = _pad([r.raw_feats for r in refs])
    feat_lens = torch.cat([r.feat_lens for r in refs])
    hidden_ref = _pad([r.hidden for r in refs])
    hidden_lens = torch.cat([r.hidden_lens for r in refs]).long()
    embeds_ref = _pad([r.embeds for r in refs])
    token_lens = torch.cat([r.token_lens for r in refs])
    with torch.inference_mode():
        hidden, lens = model.encoder(feats, feat_lens)
        embeds, token_num, alphas, fires = model.predictor(hidden_ref, hidden_lens)
        log_probs = model.decoder(hidden_ref, hidden_lens, embeds_ref, token_lens)
    assert torch.equal(lens.long(), hidden_lens)
    for row, ref in enumerate(refs):
        n, t = int(hidden_lens[row]), int(ref.alphas.shape[1])
        assert h.rel_err(hidden[row, :n], ref.hidden[0, :n]) < TOL
        assert float(token_num[row]) == float(ref.token_num[0])
        # the reference's tail frame sits right after the clip's own frames
        assert h.rel_err(alphas[row, :t], ref.alphas[0]) < TOL
        assert float(alphas[row, t:].abs().sum()) == 0.0
        assert h.rel_err(fires[row, :t], ref.fires[0]) < TOL
        k = int(ref.token_lens[0])
        assert h.rel_err(embeds[row, :k], ref.embeds[0, :k]) < TOL
        assert h.rel_err(log_probs[row, :k], ref.log_probs[0, :k]) < TOL
        assert k > 3, "the random model fires too few tokens to test anything"


def _ids(log_probs: torch.Tensor, n: int) -> list[int]:
    return log_probs[:n].argmax(-1).tolist()


def _dropped(ids: list[int]) -> list[int]:
    return [t for t in ids if t not in (0, 1, 2)]


@pytest.mark.parametrize("variant", VARIANTS, ids=["-".join(v) for v in VARIANTS])
def test_token_ids_and_text_equal_funasr_generate(variant, engines, passes, references, clips):
    """Per clip: the token count, every token not at a near-tie, and — for clips with no near-tie —
    the token ids and the printed text equal FunASR's ``generate`` on the clip alone."""
    engine = engines[variant]
    waves = [audio for _, audio in clips]
    ours = engine.transcribe_outputs(waves)
    feats, lens = oasr.features.extract_features_batch([torch.from_numpy(w) for w in waves], engine.feature_config)
    with torch.inference_mode():
        out = engine.model.recognize(feats, lens)
    positions = clear = whole = 0
    for row, (name, audio) in enumerate(clips):
        ref = passes[variant][row]
        count = float(ref.alphas[0].sum())
        assert abs(count - round(count)) > MARGIN, f"{name}: the token count is a near-tie"
        n = int(ref.token_lens[0])
        assert int(out.token_lens[row]) == n, name
        mine, theirs = _ids(out.log_probs[row], n), _ids(ref.log_probs[0], n)
        assert ours[row].tokens == _dropped(mine), name
        gaps = h.margins(ref.log_probs[0, :n])
        for j in range(n):
            if gaps[j] >= MARGIN:
                assert mine[j] == theirs[j], f"{name}: token {j}"
                clear += 1
        positions += n
        if bool((gaps >= MARGIN).all()):
            (printed,) = h.generate(references[variant], [audio])
            assert ours[row].tokens == _dropped(theirs), name
            assert ours[row].text == printed["text"], name
            whole += 1
    assert clear >= 0.95 * positions, f"only {clear} of {positions} tokens were free of near-ties"
    assert whole >= 2, f"only {whole} clips were free of near-ties"


@pytest.mark.parametrize("variant", VARIANTS[:2], ids=["-".join(v) for v in VARIANTS[:2]])
def test_batched_equals_one_at_a_time(variant, engines, clips):
    engine = engines[variant]
    waves = [audio for _, audio in clips]
    batched = engine.transcribe_outputs(waves)
    alone = [engine.transcribe_outputs(w) for w in waves]
    assert [o.tokens for o in batched] == [o.tokens for o in alone]
    assert [o.text for o in batched] == [o.text for o in alone]
    assert all(o.tokens for o in batched)
