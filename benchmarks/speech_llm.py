"""Qwen2-Audio decode throughput: OASR's ``llm`` strategy vs transformers' ``generate``, in one process.

A mid-size random Qwen2-Audio built by transformers (tower: 4 layers, d_model 384, 6 heads; LM: 8
layers, hidden 512, 8 query / 2 K/V heads, MLP 1408, vocabulary 8192) decodes the same requests
(non-stationary audio of 2 to 9 s) greedily for a fixed number of new tokens (no stop token: the
random model would stop at random, so every request generates ``--tokens`` tokens and both systems do
the same work).  Both read the same WhisperFeatureExtractor(feature_size=128) features.

Systems (one thread each, taking turns for ``--repeats`` rounds, each keeping its best):

- OASR fp32: the ``llm`` strategy over all requests at once (continuous batching) and one request per
  call; OASR int8 (``quantize_model_int8``: the LM's linears, per-channel int8 weights, fbgemm);
- transformers fp32: ``generate(do_sample=False)`` over all requests at once (left-padded) and one
  request per call.

Prints generated tokens per second, requests per second, each system's ratio to transformers in the
same mode, int8's agreement with fp32 (requests whose first token is the same; the share of tokens in
the identical prefix — on a random model the next-token distribution is flat, so one flip changes
everything after it) and the relative error of its first-step logits, and the machine.
Usage: ``python benchmarks/speech_llm.py [--requests 8] [--tokens 32] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from _common import machine, synth  # noqa: E402

torch.set_num_threads(1)
VOCAB = 8192
NEVER = VOCAB - 1  # the stop token: its output row is zero, so its logit (0) is never a random LM's argmax


def build(root: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        PreTrainedTokenizerFast,
        Qwen2AudioConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        WhisperFeatureExtractor,
    )

    specials = ["<|endoftext|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>", "<|en|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(["Detect the language and recognize the speech:"], trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    config = Qwen2AudioConfig(
        audio_config=dict(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
                          num_mel_bins=128, max_source_positions=1500, model_type="qwen2_audio_encoder"),
        text_config=dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=4096, model_type="qwen2",
                         eos_token_id=NEVER, pad_token_id=0),
        audio_token_index=tokenizer.convert_tokens_to_ids("<|AUDIO|>"))
    torch.manual_seed(0)
    model = Qwen2AudioForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "embed_positions" not in name:
                p.normal_(0.0, 1.5 / p.shape[-1] ** 0.5)
        model.lm_head.weight[NEVER].zero_()
    model.generation_config = GenerationConfig(eos_token_id=NEVER, pad_token_id=0)
    model.save_pretrained(root)
    Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tokenizer).save_pretrained(root)
    return root


def oasr_runner(loaded, audios, tokens: int, batched: bool):
    from oasr.decoding.strategy import DecodeBatch, DecodeContext
    from oasr.engine.options import DecodingOptions
    from oasr.features import FeatureConfig, extract_features_batch
    from oasr.tokenizers import build_tokenizer
    from oasr_models_hf.speech_llm.decode import LlmDecodeStrategy

    ctx = DecodeContext(model=loaded.model, tokenizer=build_tokenizer(loaded.tokenizer_spec, loaded.tokenizer_root),
                        decoding_defaults=loaded.decoding_defaults, feature_config=None, device=torch.device("cpu"))
    strategy = LlmDecodeStrategy(ctx)
    config = FeatureConfig.from_spec(loaded.feature_spec)
    options = DecodingOptions(max_new_tokens=tokens)
    groups = [audios] if batched else [[a] for a in audios]

    def run():
        out = []
        with torch.inference_mode():
            for group in groups:
                feats, lens = extract_features_batch([torch.from_numpy(a) for a in group], config)
                batch = DecodeBatch(request_ids=[str(i) for i in range(len(group))], options=[options] * len(group),
                                    waveforms=[], feats=feats, feat_lens=lens)
                out += [h.tokens for h in strategy.decode(batch)]
        return out

    return run, strategy


def hf_runner(model, processor, strategy, audios, tokens: int, batched: bool):
    groups = [audios] if batched else [[a] for a in audios]

    def run():
        out = []
        for group in groups:
            fe = processor.feature_extractor(group, sampling_rate=16000, return_attention_mask=True,
                                             padding="max_length", return_tensors="pt")
            counts = model.model.audio_tower._get_feat_extract_output_lengths(fe.attention_mask.sum(-1))[1]
            from oasr.engine.options import DecodingOptions

            prompts = [strategy.prompt_ids(int(n), DecodingOptions()) for n in counts]
            longest = max(len(p) for p in prompts)
            ids = torch.zeros(len(prompts), longest, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for r, p in enumerate(prompts):
                ids[r, longest - len(p):] = torch.tensor(p)
                mask[r, longest - len(p):] = 1
            with torch.no_grad():
                seq = model.generate(input_ids=ids, attention_mask=mask, input_features=fe.input_features,
                                     feature_attention_mask=fe.attention_mask, do_sample=False,
                                     max_new_tokens=tokens, min_new_tokens=tokens)
            out += [row[longest:].tolist() for row in seq]
        return out

    return run


def first_logits_error(fp32, int8, audio) -> float:
    """max |int8 - fp32| / max |fp32| over the next-token logits after one request's prompt."""
    from oasr.features import FeatureConfig, extract_features_batch

    feats = extract_features_batch([torch.from_numpy(audio)], FeatureConfig.from_spec(fp32.feature_spec))
    logits = []
    with torch.inference_mode():
        for loaded in (fp32, int8):
            tokens, counts = loaded.model.encode_offline(*feats)
            prompt = loaded.config.prompt
            n = int(counts[0])
            ids = torch.tensor([[prompt.audio_bos_id] + [prompt.audio_token_id] * n + [prompt.audio_eos_id]])
            x = loaded.model.language_model.embed(ids)
            x[0, 1:1 + n] = tokens[0, :n]
            logits.append(loaded.model.language_model.prefill(x)[1])
    return float((logits[1] - logits[0]).abs().max() / logits[0].abs().max())


def best_of(fn, repeats: int):
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from transformers import AutoProcessor, Qwen2AudioForConditionalGeneration

    from oasr.checkpoints.loading import load_pretrained
    from oasr.layers.quant import quantize_model_int8

    root = build(Path(tempfile.mkdtemp(prefix="oasr_qwen2_audio_")))
    audios = [synth(2.0 + 7.0 * i / max(1, args.requests - 1), seed=i) for i in range(args.requests)]
    fp32 = load_pretrained(root)
    int8 = load_pretrained(root)
    quantize_model_int8(int8.model)
    hf = Qwen2AudioForConditionalGeneration.from_pretrained(root).eval()
    processor = AutoProcessor.from_pretrained(root)

    runs = {}
    for mode in ("batched", "sequential"):
        run32, strategy = oasr_runner(fp32, audios, args.tokens, mode == "batched")
        run8, _ = oasr_runner(int8, audios, args.tokens, mode == "batched")
        runs[("OASR fp32", mode)] = run32
        runs[("OASR int8", mode)] = run8
        runs[("transformers fp32", mode)] = hf_runner(hf, processor, strategy, audios, args.tokens, mode == "batched")
    times, outputs = {}, {}
    for _ in range(args.repeats):  # systems take turns, so a co-tenant slows all of them
        for key, fn in runs.items():
            seconds, out = best_of(fn, 1)
            times[key] = min(times.get(key, float("inf")), seconds)
            outputs[key] = out
    counts = {key: sum(len(t) for t in out) for key, out in outputs.items()}
    generated = counts[("OASR fp32", "batched")]
    same = outputs[("OASR fp32", "batched")] == outputs[("transformers fp32", "batched")]
    pairs = list(zip(outputs[("OASR fp32", "batched")], outputs[("OASR int8", "batched")], strict=True))
    prefix = [next((j for j, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x)) for x, y in pairs]
    logit_error = first_logits_error(fp32, int8, audios[0])

    print(f"machine: {machine()}")
    print(f"{args.requests} requests, {args.tokens} new tokens each, audio "
          f"{sum(len(a) for a in audios) / 16000:.1f} s; OASR fp32 tokens == transformers tokens: {same}")
    print(f"{'system':<20} {'mode':<11} {'tokens/s':>9} {'requests/s':>11} {'vs transformers':>16}")
    for (system, mode), seconds in times.items():
        peer = ("transformers fp32", mode)
        ratio = (counts[(system, mode)] / seconds) / (counts[peer] / times[peer])
        print(f"{system:<20} {mode:<11} {counts[(system, mode)] / seconds:9.1f} {args.requests / seconds:11.2f} {ratio:15.2f}x")
    print(f"int8 vs fp32: first token identical in {sum(p > 0 for p in prefix)}/{len(prefix)} requests, identical "
          f"prefix {100.0 * sum(prefix) / generated:.1f} % of tokens, first-step logits relative error "
          f"{logit_error:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
