"""Tiny random FunASR models, built by FunASR's own registry and saved as ModelScope-style folders
(``config.yaml``, ``configuration.json``, ``model.pt``, ``am.mvn``, ``tokens.json``, ``seg_dict``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import yaml

#: a vocabulary mixing CJK characters, English words and ``@@`` pieces (FunASR's paraformer-zh layout:
#: <blank>, <s>, </s> first, <unk> last)
TOKENS = (["<blank>", "<s>", "</s>"]
          + list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后")
          + ["the", "a", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are",
             "hel@@", "lo", "wor@@", "ld", "b", "c", "d", "e", "x", "y", "z", "'s", "1", "2", "3"]
          + ["<unk>"])

FRONTEND = {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10,
            "lfr_m": 7, "lfr_n": 6, "dither": 0.0}

#: two shapes: (name, d_model, heads, ffn, encoder blocks, decoder blocks, kernel, tail_threshold)
SHAPES = {
    "small": dict(d=32, heads=2, ffn=64, enc=2, dec=2, kernel=11, tail=0.45),
    "deep": dict(d=48, heads=4, ffn=96, enc=4, dec=3, kernel=5, tail=0.45),
}


def paraformer_conf(shape: dict, vocab: int, model: str = "Paraformer") -> dict:
    d = shape["d"]
    conf = {
        "model": model,
        "model_conf": {"ctc_weight": 0.0, "lsm_weight": 0.1, "length_normalized_loss": True,
                       "predictor_weight": 1.0, "predictor_bias": 1, "sampling_ratio": 0.75},
        "encoder": "SANMEncoder",
        "encoder_conf": {"output_size": d, "attention_heads": shape["heads"], "linear_units": shape["ffn"],
                         "num_blocks": shape["enc"], "dropout_rate": 0.1, "positional_dropout_rate": 0.1,
                         "attention_dropout_rate": 0.1, "input_layer": "pe",
                         "pos_enc_class": "SinusoidalPositionEncoder", "normalize_before": True,
                         "kernel_size": shape["kernel"], "sanm_shfit": 0, "selfattention_layer_type": "sanm"},
        "decoder": "ParaformerSANMDecoder",
        "decoder_conf": {"attention_heads": shape["heads"], "linear_units": shape["ffn"],
                         "num_blocks": shape["dec"], "dropout_rate": 0.1, "positional_dropout_rate": 0.1,
                         "self_attention_dropout_rate": 0.1, "src_attention_dropout_rate": 0.1,
                         "att_layer_num": shape["dec"], "kernel_size": shape["kernel"], "sanm_shfit": 0},
        "predictor": "CifPredictorV2",
        "predictor_conf": {"idim": d, "threshold": 1.0, "l_order": 1, "r_order": 1,
                           "tail_threshold": shape["tail"]},
        "frontend": "WavFrontend",
        "frontend_conf": dict(FRONTEND),
        "specaug": "SpecAugLFR",
        "specaug_conf": {"apply_time_warp": False, "time_warp_window": 5, "time_warp_mode": "bicubic",
                         "apply_freq_mask": True, "freq_mask_width_range": [0, 30], "lfr_rate": 6,
                         "num_freq_mask": 1, "apply_time_mask": True, "time_mask_width_range": [0, 12],
                         "num_time_mask": 1},
        "tokenizer": "CharTokenizer",
        "tokenizer_conf": {"unk_symbol": "<unk>", "split_with_space": True},
        "input_size": 560,
        "vocab_size": vocab,
    }
    if model == "BiCifParaformer":
        conf["predictor"] = "CifPredictorV3"
        conf["predictor_conf"].update({"tail_threshold": 0.45, "tail_mask": False, "smooth_factor2": 0.25,
                                       "noise_threshold2": 0.01, "upsample_times": 3,
                                       "use_cif1_cnn": False, "upsample_type": "cnn_blstm"})
    return conf


def write_am_mvn(path: Path, dim: int, generator: torch.Generator) -> None:
    shift = (-torch.rand(dim, generator=generator) * 4 - 8).tolist()
    scale = (torch.rand(dim, generator=generator) * 0.2 + 0.2).tolist()
    fmt = lambda values: " ".join(f"{v:.6f}" for v in values)  # noqa: E731
    path.write_text(
        f"<Nnet>\n<Splice> {dim} {dim}\n[ 0 ]\n<AddShift> {dim} {dim}\n<LearnRateCoef> 0 [ {fmt(shift)} ]\n"
        f"<Rescale> {dim} {dim}\n<LearnRateCoef> 0 [ {fmt(scale)} ]\n</Nnet>\n")


def widen(model: torch.nn.Module, generator: torch.Generator, std: float = 0.1) -> None:
    """Add N(0, std) to every floating tensor so random models do not fire one token everywhere."""
    with torch.no_grad():
        for p in model.state_dict().values():
            if p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=generator) * std)


def build_funasr_dir(out: Path, conf: dict, seed: int = 0) -> Path:
    """Build ``conf['model']`` with FunASR's registry, widen its weights, save a ModelScope folder."""
    from funasr.register import tables

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    kwargs = copy.deepcopy(conf)
    name = kwargs.pop("model")
    for key in ("frontend", "frontend_conf", "tokenizer", "tokenizer_conf", "specaug", "specaug_conf"):
        kwargs.pop(key, None)
    model_conf = kwargs.pop("model_conf", {})
    model = tables.model_classes[name](**{**model_conf, **kwargs})
    widen(model, generator)
    torch.save(model.state_dict(), out / "model.pt")
    (out / "config.yaml").write_text(yaml.safe_dump(conf, allow_unicode=True, sort_keys=False))
    (out / "configuration.json").write_text(json.dumps(
        {"framework": "pytorch", "task": "auto-speech-recognition",
         "model": {"type": "funasr"}, "file_path_metas": {"init_param": "model.pt", "config": "config.yaml",
                                                           "tokenizer_conf": {"token_list": "tokens.json"},
                                                           "frontend_conf": {"cmvn_file": "am.mvn"}}}))
    (out / "tokens.json").write_text(json.dumps(TOKENS, ensure_ascii=False))
    write_am_mvn(out / "am.mvn", conf["input_size"], generator)
    return out


#: SenseVoice's tag pieces (user-defined symbols of its SentencePiece model)
SENSEVOICE_TAGS = (["<|zh|>", "<|en|>", "<|yue|>", "<|ja|>", "<|ko|>", "<|nospeech|>"]
                   + ["<|HAPPY|>", "<|SAD|>", "<|ANGRY|>", "<|NEUTRAL|>", "<|FEARFUL|>", "<|DISGUSTED|>",
                      "<|SURPRISED|>", "<|EMO_UNKNOWN|>"]
                   + ["<|BGM|>", "<|Speech|>", "<|Applause|>", "<|Laughter|>", "<|Event_UNK|>"]
                   + ["<|withitn|>", "<|woitn|>"])
BPE_NAME = "chn_jpn_yue_eng_ko_spectok.bpe.model"
BPE_TEXT = ("the quick brown fox jumps over the lazy dog she sells sea shells by the sea shore a journey of a "
            "thousand miles begins with a single step please call me back when you get this message "
            "the weather today is sunny with a light breeze ever tried ever failed no matter try again").split()

SENSEVOICE_SHAPES = {
    "small": dict(d=32, heads=2, ffn=64, enc=2, tp=1, kernel=11),
    "deep": dict(d=48, heads=4, ffn=96, enc=3, tp=2, kernel=5),
}


def write_bpe(path: Path) -> int:
    """A small SentencePiece BPE model with SenseVoice's tag pieces; returns its size."""
    import io

    import sentencepiece

    out = io.BytesIO()
    lines = [" ".join(BPE_TEXT[i:i + 9]) for i in range(0, len(BPE_TEXT), 3)]
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines * 20), model_writer=out, vocab_size=120,
                                             model_type="bpe", user_defined_symbols=SENSEVOICE_TAGS,
                                             character_coverage=1.0, bos_id=-1, eos_id=-1, unk_id=0)
    path.write_bytes(out.getvalue())
    return sentencepiece.SentencePieceProcessor(model_file=str(path)).get_piece_size()


def sensevoice_conf(shape: dict, vocab: int) -> dict:
    return {
        "model": "SenseVoiceSmall",
        "model_conf": {"length_normalized_loss": True, "sos": 1, "eos": 2, "ignore_id": -1},
        "encoder": "SenseVoiceEncoderSmall",
        "encoder_conf": {"output_size": shape["d"], "attention_heads": shape["heads"], "linear_units": shape["ffn"],
                         "num_blocks": shape["enc"], "tp_blocks": shape["tp"], "dropout_rate": 0.1,
                         "positional_dropout_rate": 0.1, "attention_dropout_rate": 0.1, "input_layer": "pe",
                         "pos_enc_class": "SinusoidalPositionEncoder", "normalize_before": True,
                         "kernel_size": shape["kernel"], "sanm_shfit": 0, "selfattention_layer_type": "sanm"},
        "ctc_conf": {"dropout_rate": 0.0, "ctc_type": "builtin", "reduce": True, "ignore_nan_grad": True},
        "frontend": "WavFrontend",
        "frontend_conf": dict(FRONTEND),
        "tokenizer": "SentencepiecesTokenizer",
        "tokenizer_conf": {"bpemodel": BPE_NAME, "unk_symbol": "<unk>", "split_with_space": True},
        "input_size": 560,
        "vocab_size": vocab,
    }


def build_sensevoice_dir(out: Path, shape: dict, seed: int = 0) -> Path:
    from funasr.register import tables

    out.mkdir(parents=True, exist_ok=True)
    vocab = write_bpe(out / BPE_NAME)
    conf = sensevoice_conf(shape, vocab)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    kwargs = copy.deepcopy(conf)
    name = kwargs.pop("model")
    for key in ("frontend", "frontend_conf", "tokenizer", "tokenizer_conf"):
        kwargs.pop(key, None)
    model_conf = kwargs.pop("model_conf", {})
    model = tables.model_classes[name](**{**model_conf, **kwargs})
    widen(model, generator, std=0.1)
    with torch.no_grad():  # make the CTC head prefer non-blank tokens somewhere
        model.ctc.ctc_lo.bias[0] -= 2.0
    torch.save(model.state_dict(), out / "model.pt")
    (out / "config.yaml").write_text(yaml.safe_dump(conf, allow_unicode=True, sort_keys=False))
    (out / "configuration.json").write_text(json.dumps(
        {"framework": "pytorch", "task": "auto-speech-recognition", "model": {"type": "funasr"},
         "file_path_metas": {"init_param": "model.pt", "config": "config.yaml",
                             "tokenizer_conf": {"bpemodel": BPE_NAME}, "frontend_conf": {"cmvn_file": "am.mvn"}}}))
    write_am_mvn(out / "am.mvn", conf["input_size"], generator)
    return out
