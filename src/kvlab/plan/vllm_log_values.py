"""How vLLM writes a value on a startup-log line or a ``vllm serve`` command line, and how kvlab reads one.

The regex pieces the :data:`kvlab.plan.vllm_log.LOG_LINES` patterns are built from (a value, its unit, a setting
after its key, the options before ``vllm serve``'s model), the kinds of value a figure is (:data:`IN_GIB` ...
:data:`NAME`), :func:`read_value` (each kind checked: ``nan``, ``-5`` or ``451.744`` are named, not skipped),
:func:`vllm_human_int` (``--max-model-len 4k`` as vLLM's parser reads it) and :func:`mask_speculative` (a draft
model's config blanked so its ``model`` is not read as the served one), and :func:`lines_holding` (the lines a
pattern is searched in). :mod:`kvlab.plan.vllm_log` finds the lines and explains them. Pure Python; no torch.
"""

from __future__ import annotations

import re
from typing import Any

from kvlab.plan.vllm_kv import VLLM_KV_CACHE_DTYPES

# a value as the line prints it, read loosely and checked by its kind (read_value): "-5", "nan", "451.744" are
# named as unreadable, not skipped as if the line were absent; never across an "=" (from each of a word's repeated
# `kv_cache_size=` the scan ran to the word's end: quadratic)
VALUE = r"([^\s=]+?)"
UNIT = r" ?((?:[KMGT]i?)?B)\b"  # "55.15 GiB", "3.81GiB"; another unit is named (vLLM prints GiB)
# a value before its words ("14.08 GiB for weight"), a whole word: a bare (\S+) was tried from each character of a
# word to its end, quadratic (a 100 KB word took minutes); the leftmost match starts at a word's start all the same
WORD = r"(?<!\S)(\S+)"
UNTIL_NEXT = r"(?:(?!Graph capturing finished).)*?"  # to its "took", not past the next (to the line's end: quadratic)
# a setting in a CLI line, an args dict or the engine config line: up to the ", " or quote that ends it there, the
# whole token otherwise ("--max-model-len 4,096" is read as "4,096" and refused, as vLLM's parser refuses it, not as 4)
SETTING_VALUE = r"""((?:[^\s,)'"}]|,(?=[^\s,)'"}]))+)"""
KEY = r"""['"]?[:=] ?['"]?"""  # `max_model_len=`, `'max_model_len': `, `kv_cache_dtype='`
# options of `vllm serve` that take no value (store_true, or BooleanOptionalAction's --enable-x / --no-x / --disable-x;
# vllm/engine/arg_utils.py, vllm/entrypoints/openai/cli_args.py): the next argument is not theirs
_SERVE_FLAGS = (
    r"--(?:no|enable|disable)-[\w-]+|--(?:trust-remote-code|enforce-eager|headless|skip-tokenizer-init|use-v2-block-manager|"
    r"async-scheduling|return-tokens-as-token-ids)"
)
# the options before `vllm serve`'s model: --opt=value, a flag of _SERVE_FLAGS, or --opt value, read once, left to right
# as argparse does (possessive `*+`, Python 3.11: backtracking tried each option two ways, time doubling with each)
SERVE_OPTIONS = r"(?: +(?:--?[\w-]+=\S+|(?:" + _SERVE_FLAGS + r")(?= )|--?[\w-]+ +(?!-)\S+))*+"
# the kinds of value a figure is (read_value checks each): GiB >= 0, GiB of either sign, a count, a concurrency, a
# utilization, a setting >= 1, a max_model_len (4k, auto), vLLM's KV cache and model dtypes, a name
IN_GIB, SIGNED_GIB, COUNT, TIMES, FRACTION, SETTING, LENGTH, KV_DTYPE, DTYPE, NAME = (
    "GiB", "signed GiB", "count", "times", "fraction", "setting", "length", "kv dtype", "dtype", "name",
)  # fmt: skip


_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
# vLLM's non-torch and CUDA graph memory are differences of two snapshots and may be printed below 0 (the llm-d
# Llama-3.3-70B log: "-0.42 GiB for CUDAGraph memory")
_SIGNED = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_WHOLE = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+")  # "451,744" as vLLM prints counts, or "1952"
_DIGITS = re.compile(r"[0-9]+")  # a setting as vLLM's parser takes it (int("1,024") fails) and its config prints it
_UNSET = ("None", "null")  # an args dump's unset setting (block_size=None): not stated
# vLLM's --dtype names (vllm/config: ModelDType) and the torch dtypes its engine config line prints -> the spec's name
_MODEL_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16", "float32": "float32", "float": "float32"}


_HUMAN = re.compile(r"([0-9]+(?:\.[0-9]+)?)([kmgtKMGT])")


def vllm_human_int(raw: str) -> int:
    """A whole number as vLLM's argument parser reads ``--max-model-len`` (``human_readable_int`` in
    ``vllm/engine/arg_utils.py``, since moved to ``vllm/utils/argparse_utils.py``): plain digits, or a number with
    a suffix; ``k m g t`` are decimal (10^3, 10^6, 10^9, 10^12) and may have decimals (``25.6k`` = 25,600, as
    vLLM's ``int(float(number) x multiplier)``), ``K M G T`` are binary (2^10, 2^20, 2^30, 2^40) on a whole number
    only (vLLM refuses ``1.5K``). ``4k`` is 4,000 tokens, ``4K`` 4,096.

    Raises:
        ValueError: anything else, or a number below 1.
    """
    m = _HUMAN.fullmatch(raw)
    if m is None and not re.fullmatch(r"[0-9]+", raw):
        raise ValueError(f"not a whole number >= 1 nor vLLM's 4k (4,000) / 4K (4,096): {raw!r}")
    if m is None:
        value = int(raw)
    elif m.group(2).islower():
        value = int(float(m.group(1)) * 10 ** (3 * ("kmgt".index(m.group(2)) + 1)))
    elif "." in m.group(1):
        raise ValueError(f"vLLM takes no decimals with the binary suffix {m.group(2)}: {raw!r}")
    else:
        value = int(m.group(1)) * 2 ** (10 * ("KMGT".index(m.group(2)) + 1))
    if value < 1:
        raise ValueError(f"not a whole number >= 1: {raw!r}")
    return value


def read_value(kind: str, raw: str, unit: str | None) -> Any:
    """The value ``raw`` (with the ``unit`` the line printed, if any) as a figure of ``kind``; None for an unset
    setting (``None``).

    Raises:
        ValueError: why ``raw`` is not such a value (the caller names the line).
    """
    if kind == NAME:  # model=None / 'model': None: an args dump's unset model states none
        return None if raw in _UNSET else raw
    if kind not in (IN_GIB, SIGNED_GIB, COUNT, TIMES) and raw in _UNSET:
        return None
    if kind in (IN_GIB, SIGNED_GIB):
        if unit not in (None, "GiB", "GB"):  # vLLM prints GiB ("GB" in V0's weights line, computed in GiB)
            raise ValueError(f"vLLM prints this figure in GiB; got {raw} {unit} (write it in GiB)")
        if not (_NUMBER if kind == IN_GIB else _SIGNED).fullmatch(raw):
            raise ValueError(f"not a number of GiB{' >= 0' if kind == IN_GIB else ''}: {raw!r}")
        return float(raw)
    if kind == LENGTH:
        return None if raw.lower() in ("auto", "-1") else vllm_human_int(raw)  # -1, auto: vLLM picks it
    if kind in (COUNT, SETTING):
        if not (_WHOLE if kind == COUNT else _DIGITS).fullmatch(raw) or (kind != COUNT and int(raw) < 1):
            floor = 0 if kind == COUNT else 1
            raise ValueError(f"not a whole number >= {floor}: {raw!r}")
        return int(raw.replace(",", ""))
    if kind == TIMES:
        if not _NUMBER.fullmatch(raw):
            raise ValueError(f"not a number >= 0: {raw!r}")
        return float(raw)
    if kind == FRACTION:
        if not _NUMBER.fullmatch(raw) or not 0 < float(raw) <= 1:
            raise ValueError(f"not a fraction of the device's memory in (0, 1]: {raw!r}")
        return float(raw)
    if kind == KV_DTYPE:
        if raw not in VLLM_KV_CACHE_DTYPES:
            raise ValueError(f"kvlab reads vLLM's KV cache dtypes {', '.join(VLLM_KV_CACHE_DTYPES)}; not {raw!r}")
        return raw
    if kind == DTYPE:
        if raw == "auto":  # the config's dtype as vLLM resolves it; the engine config line states which
            return None
        if raw not in _MODEL_DTYPES:
            raise ValueError(f"kvlab reads vLLM's model dtypes {', '.join(_MODEL_DTYPES)}; not {raw!r}")
        return _MODEL_DTYPES[raw]
    raise AssertionError(kind)



def mask_speculative(text: str) -> str:
    """``text`` with every speculative-decoding config (``speculative_config={'model': 'draft', ...}``,
    ``speculative_config=SpeculativeConfig(model='draft', ...)``, ``--speculative-config '{"model": ...}'``) blanked
    to spaces up to its closing bracket (same length and lines, so line numbers stay), so its draft ``model`` is
    not read as a second served model (vLLM's engine config line prints both: vllm/config/speculative.py)."""
    parts, done = [], 0
    # the bracket right after the setting's name (`=`, `: `, quotes, a class name between): not a later one
    for m in re.finditer(r"""speculative[_-]config['"]?[ =:]*['"]?(?:[A-Za-z_]\w*)?(?=[{(])""", text):
        i = m.end()
        if i < done:  # a config inside one already blanked: its brackets close within it (each was scanned again)
            continue
        depth, j = 0, i
        while j < len(text) and text[j] != "\n":
            depth += text[j] in "{(["
            depth -= text[j] in "})]"
            j += 1
            if depth == 0:
                break
        parts += [text[done:i], " " * (j - i)]
        done = j
    return "".join([*parts, text[done:]]) if parts else text


def lines_holding(text: str, words: tuple[str, ...]) -> list[tuple[int, int]]:
    """``(start, end)`` of each line of ``text`` that holds one of ``words``, in the text's order; ``end`` is past
    the line's newline."""
    spans = set()
    for word in words:
        i = text.find(word)
        while i >= 0:
            end = text.find("\n", i)
            end = len(text) if end < 0 else end + 1
            spans.add((text.rfind("\n", 0, i) + 1, end))
            i = text.find(word, end)
    return sorted(spans)

