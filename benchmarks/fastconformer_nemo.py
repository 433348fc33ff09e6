"""NeMo's side of ``benchmarks/fastconformer.py``; runs in NeMo's own venv (``.cache/nemo-venv``), as a subprocess.

``python benchmarks/fastconformer_nemo.py KIND OUT`` builds a random FastConformer ``KIND`` (``ctc`` or ``tdt``)
of parakeet-ctc-110m's / parakeet-tdt_ctc-110m's dimensions with NeMo's own classes from a dict config (17 × 512,
8 heads, FF 2048, depthwise kernel 9, 8× ``dw_striding`` subsampling with 256 channels, 80 mels, a SentencePiece
BPE vocabulary of up to 1024 pieces trained on a pseudo-word corpus; TDT: 2-layer LSTM predictor 640, joint 640,
durations 0..4), ``save_to()``s ``OUT/model.nemo`` and exports NeMo's ONNX graphs of the same weights for
sherpa-onnx with the metadata sherpa-onnx reads for NeMo models (``vocab_size``, ``normalize_type``,
``subsampling_factor``, ``model_type``, ...) and ``OUT/tokens.txt``:

- ``ctc``: ``OUT/model.onnx`` (``model.export()``: encoder + CTC head, log-probs out);
- ``tdt``: ``OUT/encoder.onnx``, ``OUT/decoder.onnx``, ``OUT/joiner.onnx`` (each module's ``export()``);
- ``streaming``: a cache-aware FastConformer RNN-T of the same dimensions (NeMo's cache-aware recipe: causal
  ``dw_striding`` subsampling, causal convolutions with ``layer_norm``, ``chunked_limited`` attention with
  ``att_context_size [70, 6]``: 70 frames of left context, chunks of 7 frames = 560 ms; no feature
  normalization; LSTM 2 × 640, joint 640), its encoder exported with NeMo's cache support
  (``set_export_config({"cache_support": True})``: inputs ``cache_last_channel``, ``cache_last_time``,
  ``cache_last_channel_len``) and the metadata sherpa-onnx's online NeMo transducer reads (``window_size`` =
  ``chunk_size + pre_encode_cache_size`` feature frames a call, ``chunk_shift``, the two caches' shapes,
  ``pred_rnn_layers``, ``pred_hidden``, ...); ``OUT/streaming.txt`` records NeMo's streaming config.

Like a trained model, most frames are blank: the CTC head's blank bias is calibrated on NeMo's features of a
benchmark-like clip so blank wins about 80 % of the frames, the TDT joint's blank bias on the same clip so
blank wins about half of the (frame, label) pairs (TDT skips frames), the streaming RNN-T's so NeMo's greedy
search emits about 0.35 labels a frame (its joint's encoder projection first centered on the mean frame:
unnormalized log-mels give a random encoder's frames a large common part).  Needs ``onnx`` in the NeMo venv
(``.cache/nemo-venv/bin/pip install onnx``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

MELS, D_MODEL, LAYERS, HEADS, PRED = 80, 512, 17, 8, 640
PIECES = 1024
DURATIONS = [0, 1, 2, 3, 4]
#: the streaming kind's trained context: 70 frames left, chunks of 7 (6 frames of lookahead): 560 ms
STREAM_CONTEXT = [70, 6]


def train_tokenizer(root: Path) -> Path:
    import sentencepiece as spm

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(3000)]
    lines = [" ".join(rng.choice(words, size=12)) for _ in range(4000)]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n")
    spm.SentencePieceTrainer.train(input=str(root / "corpus.txt"), model_prefix=str(root / "tokenizer"),
                                   vocab_size=PIECES, model_type="bpe", character_coverage=1.0,
                                   hard_vocab_limit=False, bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1)
    sp = spm.SentencePieceProcessor(model_file=str(root / "tokenizer.model"))
    (root / "vocab.txt").write_text("".join(sp.id_to_piece(i) + "\n" for i in range(sp.get_piece_size())))
    return root


def model_config(kind: str, tokdir: Path) -> dict:
    encoder = {"_target_": "nemo.collections.asr.modules.ConformerEncoder", "feat_in": MELS, "feat_out": -1,
               "n_layers": LAYERS, "d_model": D_MODEL, "subsampling": "dw_striding", "subsampling_factor": 8,
               "subsampling_conv_channels": 256, "causal_downsampling": False, "ff_expansion_factor": 4,
               "self_attention_model": "rel_pos", "n_heads": HEADS, "att_context_size": [-1, -1],
               "att_context_style": "regular", "xscaling": True, "untie_biases": True, "pos_emb_max_len": 5000,
               "conv_kernel_size": 9, "conv_norm_type": "batch_norm", "conv_context_size": None, "dropout": 0.0,
               "dropout_pre_encoder": 0.0, "dropout_emb": 0.0, "dropout_att": 0.0}
    cfg = {"sample_rate": 16000, "tokenizer": {"dir": str(tokdir), "type": "bpe"}, "encoder": encoder,
           "preprocessor": {"_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
                            "sample_rate": 16000, "normalize": "per_feature", "window_size": 0.025,
                            "window_stride": 0.01, "window": "hann", "features": MELS, "n_fft": 512, "log": True,
                            "frame_splicing": 1, "dither": 1e-5, "pad_to": 0, "pad_value": 0.0}}
    if kind == "ctc":
        cfg["decoder"] = {"_target_": "nemo.collections.asr.modules.ConvASRDecoder", "feat_in": D_MODEL,
                          "num_classes": -1, "vocabulary": []}
        return cfg
    if kind == "streaming":
        return streaming_config(cfg)
    cfg.update(
        model_defaults={"enc_hidden": D_MODEL, "pred_hidden": PRED, "joint_hidden": PRED,
                        "tdt_durations": DURATIONS, "num_tdt_durations": len(DURATIONS)},
        decoder={"_target_": "nemo.collections.asr.modules.RNNTDecoder", "normalization_mode": None,
                 "random_state_sampling": False, "blank_as_pad": True,
                 "prednet": {"pred_hidden": PRED, "pred_rnn_layers": 2, "t_max": None, "dropout": 0.0}},
        joint={"_target_": "nemo.collections.asr.modules.RNNTJoint", "log_softmax": None, "preserve_memory": False,
               "fuse_loss_wer": False, "fused_batch_size": -1, "num_extra_outputs": len(DURATIONS),
               "jointnet": {"joint_hidden": PRED, "activation": "relu", "dropout": 0.0}},
        decoding={"strategy": "greedy_batch", "greedy": {"max_symbols": 10}, "model_type": "tdt",
                  "durations": DURATIONS},
        loss={"loss_name": "tdt", "tdt_kwargs": {"durations": DURATIONS, "sigma": 0.02, "omega": 0.1}},
    )
    return cfg


def streaming_config(cfg: dict) -> dict:
    """``cfg`` made NeMo's cache-aware FastConformer RNN-T (the cache-aware recipe; no feature normalization:
    a streamed utterance has no whole)."""
    cfg["encoder"].update(causal_downsampling=True, att_context_size=STREAM_CONTEXT, att_context_style="chunked_limited",
                          conv_context_size="causal", conv_norm_type="layer_norm")
    cfg["preprocessor"]["normalize"] = "NA"
    cfg.update(
        model_defaults={"enc_hidden": D_MODEL, "pred_hidden": PRED, "joint_hidden": PRED},
        decoder={"_target_": "nemo.collections.asr.modules.RNNTDecoder", "normalization_mode": None,
                 "random_state_sampling": False, "blank_as_pad": True,
                 "prednet": {"pred_hidden": PRED, "pred_rnn_layers": 2, "t_max": None, "dropout": 0.0}},
        joint={"_target_": "nemo.collections.asr.modules.RNNTJoint", "log_softmax": None, "preserve_memory": False,
               "fuse_loss_wer": False, "fused_batch_size": -1,
               "jointnet": {"joint_hidden": PRED, "activation": "relu", "dropout": 0.0}},
        decoding={"strategy": "greedy_batch", "greedy": {"max_symbols": 10}},
        loss={"loss_name": "default"},
    )
    return cfg


def encoded(model) -> torch.Tensor:
    """(1, hidden, T') encoder output of NeMo's own features of a 6 s benchmark-like clip."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import synth

    signal = torch.from_numpy(synth(6.0, seed=99))[None]
    mel, mel_len = model.preprocessor(input_signal=signal, length=torch.tensor([signal.shape[1]]))
    return model.encoder(audio_signal=mel, length=mel_len)[0]


def calibrate_ctc_blank(model, share: float) -> None:
    """Raise the CTC head's blank bias so blank wins about ``share`` of the frames."""
    layer = model.decoder.decoder_layers[0]
    logits = layer(encoded(model))[0].T                            # (T', V + 1)
    gap = logits[:, :-1].max(-1).values - logits[:, -1]
    layer.bias[-1] += float(gap.quantile(share))


def calibrate_blank(model, share: float) -> None:
    """Raise the TDT joint's blank bias so blank wins about ``share`` of (frame, label) pairs."""
    head, blank = model.joint.joint_net[-1], model.decoder.blank_idx
    enc = encoded(model)
    labels = torch.arange(0, blank, max(blank // 64, 1))[:, None]
    pred, _ = model.decoder.predict(labels, state=None, add_sos=False, batch_size=labels.shape[0])
    f = model.joint.enc(enc.transpose(1, 2))[0]
    g = model.joint.pred(pred[:, 0])
    logits = head(model.joint.joint_net[:-1](f[:, None] + g[None]))[..., :blank + 1]
    gap = logits[..., :blank].max(-1).values - logits[..., blank]
    head.bias[blank] += float(gap.flatten().quantile(share))


def center_joint(model) -> None:
    """Unnormalized log-mels give every frame of a random encoder a large common part, which would pick one
    label everywhere: center the joint's encoder projection on the mean frame."""
    layer = model.joint.enc
    layer.bias.sub_(layer.weight @ encoded(model)[0].mean(-1))


def calibrate_emissions(model, rate: float) -> None:
    """Set the joint's blank bias (bisection) so NeMo's greedy search emits about ``rate`` labels per encoder
    frame on the benchmark-like clip (a trained English BPE model: roughly one label per 3 frames of 80 ms)."""
    head, blank = model.joint.joint_net[-1], model.decoder.blank_idx
    enc = encoded(model)
    lengths = torch.tensor([enc.shape[2]])
    base, low, high = float(head.bias[blank]), -40.0, 40.0
    for _ in range(16):
        head.bias[blank] = base + (low + high) / 2
        hyps = model.decoding.rnnt_decoder_predictions_tensor(encoder_output=enc, encoded_lengths=lengths,
                                                              return_hypotheses=True)
        hyp = (hyps[0] if isinstance(hyps, tuple) else hyps)[0]
        if len(hyp.y_sequence) > rate * enc.shape[2]:
            low = (low + high) / 2
        else:
            high = (low + high) / 2
    head.bias[blank] = base + high


def export_streaming(model, out: Path, meta: dict) -> None:
    """The cache-aware encoder (NeMo's cache support), decoder and joint graphs, with sherpa-onnx's online NeMo
    transducer metadata on the encoder."""
    model.set_export_config({"cache_support": True})
    enc = model.encoder
    cfg = enc.streaming_cfg
    chunk = cfg.chunk_size[1] if isinstance(cfg.chunk_size, list) else cfg.chunk_size
    cache = cfg.pre_encode_cache_size
    cache = cache[1] if isinstance(cache, list) else cache
    (out / "streaming.txt").write_text(f"{cfg}\natt_context_size {enc.att_context_size}\n")
    model.encoder.export(str(out / "encoder.onnx"))
    model.decoder.export(str(out / "decoder.onnx"))
    model.joint.export(str(out / "joiner.onnx"))
    add_metadata(out / "encoder.onnx", dict(
        meta, model_type="EncDecRNNTBPEModel", vocab_size=model.decoder.vocab_size, normalize_type="",
        window_size=chunk + cache, chunk_shift=chunk, feat_dim=MELS, pred_rnn_layers=2, pred_hidden=PRED,
        cache_last_channel_dim1=len(enc.layers), cache_last_channel_dim2=cfg.last_channel_cache_size,
        cache_last_channel_dim3=enc.d_model, cache_last_time_dim1=len(enc.layers),
        cache_last_time_dim2=enc.d_model, cache_last_time_dim3=enc.conv_context_size[0]))


def add_metadata(path: Path, meta: dict) -> None:
    import onnx

    graph = onnx.load(str(path))
    del graph.metadata_props[:]
    for key, value in meta.items():
        entry = graph.metadata_props.add()
        entry.key, entry.value = key, str(value)
    onnx.save(graph, str(path))


def main(argv: list[str]) -> int:
    from nemo.collections.asr.models import EncDecCTCModelBPE, EncDecRNNTBPEModel
    from omegaconf import OmegaConf

    kind, out = argv[0], Path(argv[1])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cls = EncDecCTCModelBPE if kind == "ctc" else EncDecRNNTBPEModel
    model = cls(cfg=OmegaConf.create(model_config(kind, train_tokenizer(out / "tok")))).eval()
    with torch.no_grad():
        model.preprocessor.featurizer.dither = 0.0
        if kind == "ctc":  # like a trained model, most frames are blank
            calibrate_ctc_blank(model, share=0.8)
        elif kind == "streaming":
            center_joint(model)
            calibrate_emissions(model, rate=0.35)
        else:
            calibrate_blank(model, share=0.5)
    model.save_to(str(out / "model.nemo"))
    vocab = list(model.tokenizer.vocab) if hasattr(model.tokenizer, "vocab") else None
    if vocab is None or len(vocab) != model.tokenizer.vocab_size:
        vocab = [model.tokenizer.ids_to_tokens([i])[0] for i in range(model.tokenizer.vocab_size)]
    (out / "tokens.txt").write_text("".join(f"{p} {i}\n" for i, p in enumerate(vocab)) + f"<blk> {len(vocab)}\n")
    # sherpa-onnx's NeMo metadata: a CTC model's vocab_size counts the blank, a transducer's does not; a
    # transducer is TDT for sherpa-onnx when its "url" names "tdt"
    meta = {"normalize_type": "per_feature", "subsampling_factor": 8, "model_author": "NeMo", "version": "2"}
    with torch.no_grad():
        if kind == "ctc":
            model.export(str(out / "model.onnx"))
            add_metadata(out / "model.onnx", dict(meta, model_type="EncDecCTCModelBPE", vocab_size=len(vocab) + 1))
        elif kind == "streaming":
            export_streaming(model, out, meta)
        else:
            model.encoder.export(str(out / "encoder.onnx"))
            model.decoder.export(str(out / "decoder.onnx"))
            model.joint.export(str(out / "joiner.onnx"))
            add_metadata(out / "encoder.onnx", dict(meta, model_type="EncDecRNNTBPEModel", vocab_size=len(vocab), feat_dim=MELS,
                                                    url="local random parakeet-tdt-110m-like model",
                                                    pred_rnn_layers=2, pred_hidden=PRED))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
