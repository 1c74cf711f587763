"""Text files as Windows tools write them: a UTF-8 byte-order mark (Notepad, Excel's "CSV UTF-8") and UTF-16 with
one (PowerShell's ``>``). Read as plain UTF-8, a workload's first column was ``\\ufefftokens`` ("got columns
['\\ufefftokens']") and a UTF-16 vLLM log was "not a vLLM startup log". A file that is not text is still refused,
with its name."""

from __future__ import annotations

import codecs
import gzip
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.paging.static import load_lengths
from kvlab.paging.trace import load_trace
from kvlab.runtime.text_files import decode_text, read_text

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm_startup_logs"
GEMMA = DATA / "configs" / "gemma-4-e2b.json"
GEMMA_LOG = DATA / "logs" / "log-gemma-4-e2b-l4.log"

ENCODINGS = [
    ("utf-8-sig", "\n"),
    ("utf-8-sig", "\r\n"),
    ("utf-16", "\r\n"),  # PowerShell's >: UTF-16-LE with its mark, CRLF
    ("utf-16-be", "\r\n"),
]


def _write(path: Path, text: str, encoding: str, newline: str) -> Path:
    raw = text.replace("\n", newline).encode(encoding)
    if encoding == "utf-16-be":
        raw = codecs.BOM_UTF16_BE + raw
    path.write_bytes(raw)
    return path


@pytest.mark.parametrize("encoding, newline", ENCODINGS)
def test_read_text_drops_the_mark_and_decodes_by_it(tmp_path, encoding, newline):
    path = _write(tmp_path / "t.txt", "tokens\n100\nüber\n", encoding, newline)
    assert read_text(path) == "tokens\n100\nüber\n"
    assert read_text(path, newline="") == "tokens\n100\nüber\n".replace("\n", newline)


def test_decode_text_refuses_bytes_that_are_not_text_naming_the_file():
    with pytest.raises(ValueError, match=r"^page\.bin: not a text file: not UTF-8 at byte 1$"):
        decode_text(b"\x1f\x8b\x08", "page.bin")
    with pytest.raises(ValueError, match=r"^x: not a text file: not UTF-16-LE \(its byte-order mark says so\)"):
        decode_text(codecs.BOM_UTF16_LE + b"\x00\xdc", "x")  # a lone low surrogate


@pytest.mark.parametrize("encoding, newline", ENCODINGS)
def test_workload_and_trace_csv_with_a_byte_order_mark(tmp_path, encoding, newline):
    workload = _write(tmp_path / "w.csv", "tokens\n100\n200\n", encoding, newline)
    assert load_lengths(workload).tolist() == [100, 200]
    lines = "prompt_tokens,output_tokens\n30,70\n50,150\n"
    assert load_lengths(_write(tmp_path / "p.csv", lines, encoding, newline)).tolist() == [100, 200]
    trace = _write(tmp_path / "t.csv", "arrival_step,prompt_tokens,output_tokens\n0,30,70\n2,50,150\n", encoding, newline)
    assert load_trace(trace).prompt_tokens.tolist() == [30, 50]


def test_paging_static_cli_reads_a_workload_with_a_byte_order_mark(tmp_path, capsys):
    workload = _write(tmp_path / "w.csv", "tokens\n100\n200\n", "utf-8-sig", "\r\n")
    assert main(["paging", "static", "--workload", str(workload)]) == 0
    assert "\\ufeff" not in capsys.readouterr().err


def test_workload_and_trace_that_are_not_text_are_refused_naming_the_file(tmp_path):
    binary = tmp_path / "w.csv"
    binary.write_bytes(gzip.compress(b"tokens\n100\n"))
    for load in (load_lengths, load_trace):
        with pytest.raises(ValueError, match=rf"^{binary}: not a text file"):
            load(binary)


@pytest.mark.parametrize("encoding, newline", ENCODINGS)
def test_from_log_reads_a_utf16_log_as_the_utf8_one(tmp_path, encoding, newline, capsys):
    argv = ["plan", str(GEMMA), "--gpu-mem-gib", "22.49", "--json", "--from-log"]
    assert main([*argv, str(GEMMA_LOG)]) == 0
    want = capsys.readouterr().out
    log = _write(tmp_path / "vllm.log", GEMMA_LOG.read_text(encoding="utf-8"), encoding, newline)
    assert main([*argv, str(log)]) == 0
    assert capsys.readouterr().out.replace(str(log), str(GEMMA_LOG)) == want


def test_from_log_that_is_not_text_is_still_refused_naming_the_file(tmp_path, capsys):
    log = tmp_path / "vllm.log.gz"
    log.write_bytes(gzip.compress(GEMMA_LOG.read_bytes()))
    assert main(["plan", str(GEMMA), "--gpu-mem-gib", "22.49", "--from-log", str(log)]) == 2
    assert f"--from-log {log}: " in capsys.readouterr().err
