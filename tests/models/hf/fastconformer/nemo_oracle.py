"""NeMo's side of the ``.nemo`` parity tests; run by the tests in NeMo's own venv (a subprocess).

``python nemo_oracle.py KIND OUT WAV...`` builds a tiny random FastConformer model of ``KIND`` (``ctc``,
``rnnt``, ``tdt``, ``hybrid``, and the cache-aware ``ctc_cache``, ``rnnt_cache``, ``tdt_cache``) from a dict config with NeMo's own classes — a SentencePiece
tokenizer trained on a small corpus, init widened so the tokens vary (BatchNorm statistics random, a CTC head
scaled up, a transducer joint's blank bias calibrated so blank wins about 80 % of the (frame, label) pairs) —
``save_to()``s ``OUT/model.nemo``, and writes ``OUT/oracle.pt``: ``transcribe()``'s text and token ids per
clip (each clip alone, batch size 1) and, after ``.eval()`` (``transcribe()`` leaves dropout on), NeMo's
log-mel features and encoder output per clip; for the TDT kinds also NeMo's beam search (``beam_outputs``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import soundfile
import torch

WORDS = ("the quick brown fox jumps over the lazy dog please call me back when you get this message "
         "no the weather today is sunny with a light breeze and the sea is calm").split()
MELS, D_MODEL, PRED = 80, 32, 40
#: the hybrid's joint is wider than its predictor (NeMo's joint_hidden != pred_hidden); the others tie them
JOINT = {"hybrid": 48}
DURATIONS = [0, 1, 2, 3, 4]
CTC, TDT, CACHE_AWARE = ("ctc", "ctc_cache"), ("tdt", "tdt_cache"), ("ctc_cache", "rnnt_cache", "tdt_cache")


def train_tokenizer(root: Path) -> Path:
    import sentencepiece as spm

    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus.txt"
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS, size=8)) for _ in range(400)]
    corpus.write_text("\n".join(lines) + "\n")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(root / "tokenizer"), vocab_size=48,
                                   model_type="bpe", character_coverage=1.0, hard_vocab_limit=False,
                                   bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1)
    sp = spm.SentencePieceProcessor(model_file=str(root / "tokenizer.model"))
    (root / "vocab.txt").write_text("".join(sp.id_to_piece(i) + "\n" for i in range(sp.get_piece_size())))
    return root


def encoder_config(cache_aware: bool) -> dict:
    cfg = {"_target_": "nemo.collections.asr.modules.ConformerEncoder", "feat_in": MELS, "feat_out": -1,
           "n_layers": 2, "d_model": D_MODEL, "subsampling": "dw_striding", "subsampling_factor": 8,
           "subsampling_conv_channels": 16, "causal_downsampling": False, "ff_expansion_factor": 2,
           "self_attention_model": "rel_pos", "n_heads": 2, "att_context_size": [-1, -1],
           "att_context_style": "regular", "xscaling": True, "untie_biases": True, "pos_emb_max_len": 5000,
           "conv_kernel_size": 9, "conv_norm_type": "batch_norm", "conv_context_size": None, "dropout": 0.0,
           "dropout_pre_encoder": 0.0, "dropout_emb": 0.0, "dropout_att": 0.0}
    if cache_aware:
        # NeMo's cache-aware FastConformer recipe (the first context size is the default one), with a context
        # short enough that both the left window (14 frames) and the chunks (7) bind on a few seconds of speech
        cfg.update(causal_downsampling=True, att_context_size=[[14, 6], [14, 1]],
                   att_context_style="chunked_limited", conv_context_size="causal", conv_norm_type="layer_norm")
    return cfg


def model_config(kind: str, tokdir: Path) -> dict:
    cfg = {
        "sample_rate": 16000,
        "tokenizer": {"dir": str(tokdir), "type": "bpe"},
        "preprocessor": {"_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
                         "sample_rate": 16000, "window_size": 0.025,
                         "window_stride": 0.01, "window": "hann", "features": MELS, "n_fft": 512, "log": True,
                         "frame_splicing": 1, "dither": 1e-5, "pad_to": 0, "pad_value": 0.0,
                         # NeMo's cache-aware recipes do not normalize (a streamed utterance has no whole)
                         "normalize": "NA" if kind in CACHE_AWARE else "per_feature"},
        "encoder": encoder_config(kind in CACHE_AWARE),
    }
    ctc_decoder = {"_target_": "nemo.collections.asr.modules.ConvASRDecoder", "feat_in": D_MODEL,
                   "num_classes": -1, "vocabulary": []}
    if kind in CTC:
        return dict(cfg, decoder=ctc_decoder)
    tdt = kind in TDT
    cfg.update(
        model_defaults={"enc_hidden": D_MODEL, "pred_hidden": PRED, "joint_hidden": JOINT.get(kind, PRED),
                        **({"tdt_durations": DURATIONS, "num_tdt_durations": len(DURATIONS)} if tdt else {})},
        decoder={"_target_": "nemo.collections.asr.modules.RNNTDecoder", "normalization_mode": None,
                 "random_state_sampling": False, "blank_as_pad": True,
                 "prednet": {"pred_hidden": PRED, "pred_rnn_layers": 2, "t_max": None, "dropout": 0.0}},
        joint={"_target_": "nemo.collections.asr.modules.RNNTJoint", "log_softmax": None,
               "preserve_memory": False, "fuse_loss_wer": False, "fused_batch_size": -1,
               "jointnet": {"joint_hidden": JOINT.get(kind, PRED), "activation": "relu", "dropout": 0.0},
               **({"num_extra_outputs": len(DURATIONS)} if tdt else {})},
        # at most 3 labels a frame (a random joint that prefers a label at a frame keeps preferring it there)
        decoding={"strategy": "greedy_batch", "greedy": {"max_symbols": 3},
                  **({"model_type": "tdt", "durations": DURATIONS} if tdt else {})},
        loss=({"loss_name": "tdt", "tdt_kwargs": {"durations": DURATIONS, "sigma": 0.02, "omega": 0.1}} if tdt
              else {"loss_name": "default"}),
    )
    if kind == "hybrid":
        cfg["aux_ctc"] = {"ctc_loss_weight": 0.3, "use_cer": False, "ctc_reduction": "mean_batch",
                          "decoder": ctc_decoder, "decoding": {"strategy": "greedy"}}
    return cfg


def build(kind: str, tokdir: Path):
    from nemo.collections.asr.models import EncDecCTCModelBPE, EncDecHybridRNNTCTCBPEModel, EncDecRNNTBPEModel
    from omegaconf import OmegaConf

    cls = {"ctc": EncDecCTCModelBPE, "ctc_cache": EncDecCTCModelBPE,
           "hybrid": EncDecHybridRNNTCTCBPEModel}.get(kind, EncDecRNNTBPEModel)
    torch.manual_seed(0)
    return cls(cfg=OmegaConf.create(model_config(kind, tokdir)))


def speech_features(model, wavs: list[Path]) -> torch.Tensor:
    """(1, MELS, T): the preprocessor's features of the clips, end to end (eval mode: no dither)."""
    model.eval()
    feats = []
    with torch.no_grad():
        for wav in wavs:
            audio, _ = soundfile.read(str(wav), dtype="float32")
            signal = torch.from_numpy(audio)[None]
            mel, mel_len = model.preprocessor(input_signal=signal, length=torch.tensor([signal.shape[1]]))
            feats.append(mel[:, :, : int(mel_len[0])])
    return torch.cat(feats, dim=2)


def widen(model, kind: str, feats: torch.Tensor) -> None:
    """``feats``: unnormalized speech features, which a cache-aware kind (no normalization) is calibrated on."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for module in model.encoder.modules():  # as transformers' initializer_range=0.5
            if isinstance(module, torch.nn.Linear | torch.nn.Conv1d | torch.nn.Conv2d):
                module.weight.normal_(0.0, 0.5, generator=generator)
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm1d):
                module.running_mean.uniform_(-0.5, 0.5, generator=generator)
                module.running_var.uniform_(0.5, 2.0, generator=generator)
                module.weight.uniform_(0.5, 1.5, generator=generator)
                module.bias.uniform_(-0.2, 0.2, generator=generator)
        heads = [model.decoder] if kind in CTC else ([model.ctc_decoder] if kind == "hybrid" else [])
        for head in heads:
            layer = head.decoder_layers[0]
            layer.weight.mul_(4.0)
            layer.bias.uniform_(-1.0, 1.0, generator=generator)
        if kind in TDT + ("rnnt_cache",):
            # TDT skips frames, and unnormalized features vary little: the frames, not the last label or a
            # bias, must choose the labels
            model.joint.pred.weight.mul_(0.2)
            model.joint.enc.weight.mul_(4.0)
            model.joint.joint_net[-1].bias.zero_()
        if kind in CACHE_AWARE:
            # unnormalized log-mels give every frame of a random encoder a large common part, which would pick
            # one label everywhere: center the head's (CTC) or the joint's encoder projection on the mean frame
            model.eval()
            enc, _ = model.encoder(audio_signal=feats, length=torch.tensor([feats.shape[2]]))
            layer = model.decoder.decoder_layers[0] if kind in CTC else model.joint.enc
            layer.bias.sub_(layer.weight.reshape(layer.weight.shape[0], -1) @ enc[0].mean(-1))
        if kind not in CTC:
            calibrate_blank(model, share=0.5 if kind in TDT else 0.8,
                            feats=feats if kind in CACHE_AWARE else None)


def calibrate_blank(model, share: float = 0.8, feats: torch.Tensor | None = None) -> None:
    """Raise the joint's blank bias so blank wins about ``share`` of (frame, label) pairs on ``feats``
    (default: normal features)."""
    model.eval()
    head = model.joint.joint_net[-1]
    head.weight.mul_(0.25)
    blank = model.decoder.blank_idx
    if feats is None:
        feats = torch.randn(1, MELS, 320, generator=torch.Generator().manual_seed(7))
    enc, _ = model.encoder(audio_signal=feats, length=torch.tensor([feats.shape[2]]))
    labels = torch.arange(blank)[:, None]
    pred, _ = model.decoder.predict(labels, state=None, add_sos=False, batch_size=blank)
    f = model.joint.enc(enc.transpose(1, 2))[0]                    # (T, J)
    g = model.joint.pred(pred[:, 0])                               # (U, J)
    logits = head(model.joint.joint_net[:-1](f[:, None] + g[None]))[..., :blank + 1]
    gap = logits[..., :blank].max(-1).values - logits[..., blank]
    head.bias[blank] += float(gap.flatten().quantile(share))


def hypothesis_fields(hyps) -> tuple[list[str], list[list[int]], list]:
    """Text, token ids and (CTC) frame log-probs of ``transcribe()``'s hypotheses.

    A CTC hypothesis' ``y_sequence`` is the (T, V + 1) log-probs greedy decoding collapsed (its ids: the
    argmax path without repeats and blanks); a transducer's is the emitted ids."""
    if isinstance(hyps, tuple):  # older NeMo: (best, all)
        hyps = hyps[0]
    texts, tokens, logprobs = [], [], []
    for h in hyps:
        texts.append(h.text if isinstance(h.text, str) else str(h.text))
        seq = h.y_sequence
        if torch.is_tensor(seq) and seq.dim() == 2:
            blank, ids, prev = seq.shape[1] - 1, [], None
            for i in seq.argmax(-1).tolist():
                if i != prev and i != blank:
                    ids.append(i)
                prev = i
            tokens.append(ids)
            logprobs.append(seq.detach().float().clone())
        else:
            tokens.append([int(t) for t in (seq.tolist() if torch.is_tensor(seq) else seq)])
            logprobs.append(None)
    return texts, tokens, logprobs


def beam_outputs(model, wavs: list[Path], encoded: list[torch.Tensor], strategy: str, beam: int = 4) -> dict:
    """A TDT model's beam search (``decoding.strategy`` ``"beam"``: ``BeamTDTInfer`` search_type "default", or
    ``"maes"``, NeMo's default mAES settings): ``transcribe()``'s best text and ids per clip, and the whole
    n-best (labels, score, text) of the search run on the saved encoder outputs, under keys ``"{strategy}_..."``."""
    import copy

    from omegaconf import open_dict

    cfg = copy.deepcopy(model.cfg.decoding)
    with open_dict(cfg):
        cfg.strategy = strategy
        cfg.beam = {"beam_size": beam, "return_best_hypothesis": True, "score_norm": True}
    model.change_decoding_strategy(cfg, verbose=False)
    texts, tokens = [], []
    for wav in wavs:
        t, ids, _ = hypothesis_fields(model.transcribe([str(wav)], batch_size=1, return_hypotheses=True,
                                                       verbose=False))
        texts += t
        tokens += ids
    model.eval()
    search = model.decoding.decoding
    search.return_best_hypothesis = False
    nbest = []
    with torch.no_grad():
        for enc in encoded:
            (hyps,) = search(encoder_output=enc.T[None].contiguous(), encoded_lengths=torch.tensor([enc.shape[0]]))
            nbest.append([{"tokens": [int(x) for x in h.y_sequence.tolist()], "score": float(h.score),
                           "text": model.tokenizer.ids_to_text([int(x) for x in h.y_sequence.tolist()])}
                          for h in hyps[0].n_best_hypotheses])
    return {"beam_size": beam, f"{strategy}_texts": texts, f"{strategy}_tokens": tokens, f"{strategy}_nbest": nbest}


def main(argv: list[str]) -> int:
    kind, out = argv[0], Path(argv[1])
    wavs = [Path(p) for p in argv[2:]]
    torch.set_num_threads(1)
    model = build(kind, train_tokenizer(out / "tok"))
    widen(model, kind, speech_features(model, wavs))
    model.eval()
    model.save_to(str(out / "model.nemo"))
    from omegaconf import open_dict

    with open_dict(model._cfg):  # transcribe() reads use_start_end_token from validation_ds
        model._cfg.validation_ds = {"use_start_end_token": False}
    texts, tokens, logprobs = [], [], []
    for wav in wavs:  # each clip alone: batch size 1
        t, ids, lp = hypothesis_fields(model.transcribe([str(wav)], batch_size=1, return_hypotheses=True,
                                                        verbose=False))
        texts += t
        tokens += ids
        logprobs += lp
    extra = {}
    if kind == "hybrid":  # the auxiliary CTC head's own transcription
        model.change_decoding_strategy(decoder_type="ctc")
        for wav in wavs:
            t, ids, lp = hypothesis_fields(model.transcribe([str(wav)], batch_size=1, return_hypotheses=True,
                                                            verbose=False))
            for key, value in (("ctc_texts", t), ("ctc_tokens", ids), ("ctc_logprobs", lp)):
                extra.setdefault(key, []).extend(value)
    model.eval()
    feats, encoded = [], []
    with torch.no_grad():
        for wav in wavs:
            audio, rate = soundfile.read(str(wav), dtype="float32")
            assert rate == 16000, rate
            signal = torch.from_numpy(audio)[None]
            mel, mel_len = model.preprocessor(input_signal=signal, length=torch.tensor([signal.shape[1]]))
            enc, enc_len = model.encoder(audio_signal=mel, length=mel_len)
            feats.append(mel[0, :, : int(mel_len[0])].T.contiguous())
            encoded.append(enc[0, :, : int(enc_len[0])].T.contiguous())
    if kind in TDT:
        for strategy in ("beam", "maes"):
            extra.update(beam_outputs(model, wavs, encoded, strategy))
    keys = sorted(model.state_dict())
    torch.save({"texts": texts, "tokens": tokens, "logprobs": logprobs, "feats": feats, "encoder": encoded, "keys": keys,
                "vocab_size": int(model.tokenizer.vocab_size), **extra}, out / "oracle.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
