"""``whisper``: a Whisper vocabulary (byte-level BPE in a ``tokenizer.json``) and its special tokens.

Hugging Face and CTranslate2 Whisper checkpoints both ship a ``tokenizer.json``.  The byte-level text
vocabulary is decoded by the ``tokenizers`` library; the special tokens follow it in this order::

    <|endoftext|> <|startoftranscript|> <|en|> ... (one per language) <|translate|> <|transcribe|>
    <|startoflm|> <|startofprev|> <|nospeech|> (older files: <|nocaptions|>) <|notimestamps|>
    <|0.00|> <|0.02|> ... <|30.00|>   (1501 timestamp tokens, 20 ms apart)

The ids are read from the file by name, so multilingual (99 or 100 languages) and English-only
(``.en``, GPT-2 text vocabulary, one id lower) vocabularies both work; timestamp tokens start right
after ``<|notimestamps|>`` whether or not the file lists them.  Every id from ``<|endoftext|>`` up is
special (never in text).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from oasr.errors import CheckpointFormatError
from oasr.tokenizers.base import TokenizerError, resolve_file
from oasr.tokenizers.huggingface import HuggingFaceTokenizer, load_tokenizer_json

TIMESTAMP_COUNT = 1501
TIME_PRECISION = 0.02
_LANGUAGE_TOKEN = re.compile(r"<\|([a-z]{2,3})\|>")
# older Hugging Face files spell Hebrew with its withdrawn ISO code; openai-whisper uses "he"
_LANGUAGE_ALIASES = {"iw": "he"}

# Symbols openai-whisper suppresses so that decoding does not invent speaker tags or annotations; a
# symbol counts when it is a single token, bare or after a space.  The musical symbols (U+2640 to
# U+267F share their first two UTF-8 bytes) count by their first token however they split.
_NON_SPEECH_SYMBOLS = tuple('"#()*+/:;<=>@[\\]^_`{|}~「」『』') + tuple(
    "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split())
_MUSIC_SYMBOLS = tuple("♩♪♫♬♭♮♯")


class WhisperTokenizer(HuggingFaceTokenizer):
    kind = "whisper"

    def __init__(self, backend: Any, *, special_ids=()):
        vocab = backend.get_vocab(with_added_tokens=True)

        def need(*names: str) -> int:
            for name in names:
                if name in vocab:
                    return int(vocab[name])
            raise CheckpointFormatError(f"Whisper tokenizer.json has no {' / '.join(names)} token")

        self.eot = need("<|endoftext|>")
        self.sot = need("<|startoftranscript|>")
        self.translate = need("<|translate|>")
        self.transcribe = need("<|transcribe|>")
        self.sot_lm = need("<|startoflm|>")
        self.sot_prev = need("<|startofprev|>")
        self.no_speech = need("<|nospeech|>", "<|nocaptions|>")
        self.no_timestamps = need("<|notimestamps|>")
        self.timestamp_begin = self.no_timestamps + 1
        languages = {}
        for token_id, token in backend.get_added_tokens_decoder().items():
            match = _LANGUAGE_TOKEN.fullmatch(token.content)
            if match and self.sot < token_id < self.translate:
                code = match.group(1)
                languages[int(token_id)] = _LANGUAGE_ALIASES.get(code, code)
        self._language_ids = {code: token_id for token_id, code in sorted(languages.items())}
        super().__init__(backend, special_ids=special_ids)
        self._vocab_size = self.timestamp_begin + TIMESTAMP_COUNT
        self._special_ids = frozenset(self._special_ids | set(range(self.eot, self._vocab_size)))

    @classmethod
    def from_spec(cls, spec: Any, root: Path | str | None) -> WhisperTokenizer:
        path = resolve_file(spec, root, ("tokenizer", "tokenizer_json"))
        return cls(load_tokenizer_json(path), special_ids=spec.special_ids)

    # -- vocabulary facts ------------------------------------------------------------------------------
    @property
    def multilingual(self) -> bool:
        """True for multilingual vocabularies (51865+ ids), False for ``.en`` ones (51864)."""
        return self._vocab_size >= 51865

    @property
    def languages(self) -> tuple[str, ...]:
        """Language codes in token order (``en``, ``zh``, ``de``, ...)."""
        return tuple(self._language_ids)

    @property
    def language_ids(self) -> tuple[int, ...]:
        return tuple(self._language_ids.values())

    def language_token(self, code: str) -> int:
        try:
            return self._language_ids[_LANGUAGE_ALIASES.get(code, code)]
        except KeyError:
            raise TokenizerError(
                f"language {code!r} has no token in this Whisper vocabulary; known: {', '.join(self._language_ids)}"
            ) from None

    def sot_sequence(self, language: str | None = None, task: str | None = None) -> list[int]:
        """The decoder prompt: ``<|startoftranscript|>`` [language token] [task token].

        English-only vocabularies take ``[<|startoftranscript|>]`` alone; asking them for another
        language or for translation is an error.
        """
        if task not in (None, "transcribe", "translate"):
            raise TokenizerError(f"Whisper task must be 'transcribe' or 'translate', got {task!r}")
        if not self.multilingual:
            if language not in (None, "en") or task == "translate":
                raise TokenizerError(
                    f"an English-only Whisper vocabulary cannot take language={language!r}, task={task!r}")
            return [self.sot]
        seq = [self.sot]
        if language is not None:
            seq.append(self.language_token(language))
        if task is not None:
            seq.append(self.transcribe if task == "transcribe" else self.translate)
        return seq

    def is_timestamp(self, token_id: int) -> bool:
        return self.timestamp_begin <= token_id < self._vocab_size

    def timestamp_seconds(self, token_id: int) -> float:
        return (token_id - self.timestamp_begin) * TIME_PRECISION

    def timestamp_token(self, seconds: float) -> int:
        index = round(seconds / TIME_PRECISION)
        if not 0 <= index < TIMESTAMP_COUNT:
            raise TokenizerError(f"timestamp {seconds} s is outside Whisper's 0..30 s window")
        return self.timestamp_begin + index

    # -- text ------------------------------------------------------------------------------------------
    def id_to_piece(self, token_id: int) -> str:
        if self.is_timestamp(token_id):
            return f"<|{self.timestamp_seconds(token_id):.2f}|>"
        return super().id_to_piece(token_id)

    def decode_with_timestamps(self, ids: list[int]) -> str:
        """Text with timestamp tokens written as ``<|1.08|>``; other specials are skipped."""
        out: list[str] = []
        run: list[int] = []
        for token_id in ids:
            token_id = int(token_id)
            if self.is_timestamp(token_id):
                out.append(self.decode(run))
                out.append(f"<|{self.timestamp_seconds(token_id):.2f}|>")
                run = []
            else:
                run.append(token_id)
        out.append(self.decode(run))
        return "".join(out)

    def non_speech_tokens(self) -> list[int]:
        """Ids openai-whisper suppresses to keep speaker tags and annotations out of transcripts.

        Hyphens and single quotes stay allowed between words, not at the start of one.
        """
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in _NON_SPEECH_SYMBOLS + _MUSIC_SYMBOLS:
            for ids in (self.encode(symbol), self.encode(" " + symbol)):
                if len(ids) == 1 or symbol in _MUSIC_SYMBOLS:
                    result.add(ids[0])
        return sorted(result)
