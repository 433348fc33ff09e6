"""``oasr transcribe`` and ``oasr serve`` run Qwen2-Audio: the CLI's JSON and the server's answer equal the engine's."""

from __future__ import annotations

from tests.serve.harness import check_served_text_equals_engine, check_transcribe_cli_equals_engine


def test_oasr_transcribe_runs_qwen2_audio(llm_dir, speech, tmp_path, capsys):
    check_transcribe_cli_equals_engine(llm_dir, speech[1], tmp_path, capsys)


def test_oasr_serve_runs_qwen2_audio(llm_dir, speech):
    check_served_text_equals_engine(llm_dir, speech[0], "qwen2-audio")
