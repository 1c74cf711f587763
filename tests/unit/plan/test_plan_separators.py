"""Numbers of 10,000 and more in the prose of ``kvlab plan`` / ``kvlab roofline`` (notes, warnings, titles, row
labels, cells) carry thousands separators, as kvlab writes numbers (:func:`kvlab.plan.config_fields.number_text`):
"--max-num-seqs 100000000 (--batch 100000000)" in a note, "batch 30000 x 100,000 tokens" in a title and
"192855.351 ms" in a cell did not. The emitted ``vllm serve`` command keeps its plain numbers: vLLM parses them."""

from __future__ import annotations

import re

import pytest

from kvlab.cli import main

MODEL = "llama-3-8b"
BIG_BATCH, BIG_CONTEXT = 100_000_000, 20_000
RAW = re.compile(r"(?<![\d,.])\d{5,}(?![\d,])")  # five digits or more, not part of a separated number


def _run(capsys, argv) -> tuple[str, str]:
    assert main(argv) == 0
    return capsys.readouterr()


def _raw_numbers(text: str) -> list[str]:
    """Lines of ``text`` with a raw number of 5+ digits, leaving out the emitted command and the datasheet URL."""
    return [line for line in text.splitlines() if RAW.search(line) and not line.startswith("vllm serve")
            and "http" not in line]


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", MODEL, "--batch", str(BIG_BATCH), "--context", str(BIG_CONTEXT)],
        ["plan", MODEL, "--batch", str(BIG_BATCH), "--context", "1000", "--emit", "vllm"],
        ["plan", MODEL, "--kv-dtype", "mixed-demo", "--batch", str(BIG_BATCH), "--context", str(BIG_CONTEXT)],
        ["plan", MODEL, "--kv-dtype", "mixed-demo", "--batch", str(BIG_BATCH), "--emit", "vllm"],
        ["roofline", "--model", MODEL, "--batch", str(BIG_BATCH), "--context", str(BIG_CONTEXT)],
    ],
)
def test_no_raw_number_of_five_digits_in_prose(capsys, argv):
    out, err = _run(capsys, argv)
    assert _raw_numbers(out) == [] and _raw_numbers(err) == []


def test_the_emitted_command_keeps_plain_numbers_and_the_note_separates_them(capsys):
    out, _ = _run(capsys, ["plan", MODEL, "--batch", str(BIG_BATCH), "--context", "1000", "--emit", "vllm"])
    (command,) = [line for line in out.splitlines() if line.startswith("vllm serve")]
    assert f"--max-num-seqs {BIG_BATCH} " in command
    text = " ".join(out.split())
    assert f"--max-num-seqs {BIG_BATCH:,} (--batch {BIG_BATCH:,})" in text
    assert f"{BIG_BATCH:,} sequences of 1,000 tokens" in text


def test_a_safetensors_header_past_the_file_is_named_with_separators(tmp_path):
    from kvlab.plan.weights import safetensors_header_bytes

    length, body = 123_456, b"{}" * 6_000  # a header length past the 12,008-byte file
    path = tmp_path / "w.safetensors"
    path.write_bytes(length.to_bytes(8, "little") + body)
    with pytest.raises(ValueError) as info:
        safetensors_header_bytes(path)
    assert f"header length {length:,} B exceeds the file ({8 + len(body):,} B)" in str(info.value)


def test_piped_output_is_wider_than_80_columns(capsys, monkeypatch):
    """Into a pipe rich took 80 columns and wrapped the plan's ledger cells (the decode bound's "memory-bound; 15.96
    GiB per" / "step ..."): stdout_console is PIPE_WIDTH columns there unless COLUMNS says otherwise."""
    from kvlab.cli import main
    from kvlab.runtime.console import PIPE_WIDTH, stdout_console

    monkeypatch.delenv("COLUMNS", raising=False)
    assert stdout_console().width == PIPE_WIDTH  # capsys: stdout is not a terminal
    assert main(["plan", "llama-3-8b"]) == 0
    wide = capsys.readouterr().out.splitlines()
    (bound,) = [line for line in wide if "decode step lower bound" in line]
    assert "memory-bound;" in bound and bound.rstrip().endswith("│") and len(bound) > 80
    monkeypatch.setenv("COLUMNS", "80")
    assert stdout_console().width == 80
    assert main(["plan", "llama-3-8b"]) == 0
    assert len(capsys.readouterr().out.splitlines()) > len(wide)  # 80 columns wrap cells onto more lines


def test_a_table_title_is_not_wrapped_inside_a_narrower_table(capsys, monkeypatch):
    """plan's first table is narrower than its title: into a pipe the title wrapped mid-phrase ("... tp" / "1");
    kvlab.commands.table makes the table at least as wide as its title (up to the console's width)."""
    from kvlab.cli import main

    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["plan", "llama-3-8b"]) == 0
    first = capsys.readouterr().out.splitlines()[0].strip()
    assert first.startswith("llama-3-8b:") and first.endswith("[GiB = 2^30 B, GB = 1e9 B]") and "tp 1" in first
