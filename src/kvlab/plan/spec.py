"""Model spec: the few numbers of a transformers ``config.json`` that size the KV cache.

A :class:`ModelSpec` is read from the model's own config (a file, a directory, a dict, a hub id, or a built-in
preset) so that the traps of hand-typed calculators do not apply:

* ``head_dim`` is read when present; ``hidden_size / num_attention_heads`` is only the fallback
  (Mistral-Small-24B: 128 in the config, 160 derived; gpt-oss-20b: 64 vs 45).
* ``num_key_value_heads`` missing or null means multi-head attention; Falcon's ``multi_query`` means one KV head.
* MLA (DeepSeek-V2 arXiv:2405.04434 §2.1): a layer caches one latent of ``kv_lora_rank + qk_rope_head_dim``
  values per token, not K and V per head.
* Sliding-window layers (``sliding_window`` with ``layer_types``, ``sliding_window_pattern`` or a model-type
  default; ``use_sliding_window: false`` turns it off), chunked layers (Llama 4), layers without KV (Mamba or
  linear-attention layers of hybrids) and KV-shared layers (Gemma-3n ``num_kv_shared_layers``) are told apart.

Pure Python; no torch.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# Layer kinds, one per decoder layer.
FULL = "full"  # attention over every past token: stores K/V for the whole context
SLIDING = "sliding"  # attention over the last `sliding_window` tokens
CHUNKED = "chunked"  # attention inside fixed chunks of `attention_chunk_size` tokens (Llama 4)
SHARED = "shared"  # attention that reuses the K/V of an earlier layer: stores nothing (Gemma-3n)
NO_KV = "none"  # no attention (Mamba, linear attention, MLP-only block): no per-token cache
LAYER_KINDS = (FULL, SLIDING, CHUNKED, SHARED, NO_KV)
KV_KINDS = (FULL, SLIDING, CHUNKED)  # kinds that store K/V of their own

DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "float64": 8,
}

# Values of `layer_types` / `layers_block_type` and the kind they mean.
_LAYER_TYPE_KIND = {
    "full_attention": FULL,
    "attention": FULL,
    "global_attention": FULL,
    "global": FULL,
    "sliding_attention": SLIDING,
    "sliding_window_attention": SLIDING,
    "local_attention": SLIDING,
    "local": SLIDING,
    "chunked_attention": CHUNKED,
    "linear_attention": NO_KV,
    "mamba": NO_KV,
    "mamba2": NO_KV,
    "conv": NO_KV,
    "recurrent": NO_KV,
    "rwkv": NO_KV,
    "mlp": NO_KV,
    "moe": NO_KV,
}
# Nemotron-H style `hybrid_override_pattern`: one character per layer.
_PATTERN_KIND = {"*": FULL, "M": NO_KV, "-": NO_KV, "E": NO_KV}


@dataclass(frozen=True)
class ModelSpec:
    """What sizes a decoder's KV cache, read from its ``config.json`` (see :func:`spec_from_config`).

    Per token, a layer of kind ``full``/``sliding``/``chunked`` stores :attr:`kv_elements_per_token_per_layer`
    values: ``2 * num_kv_heads * head_dim`` (K and V, ``[batch, kv_heads, tokens, head_dim]`` each) or, for MLA,
    one latent of ``kv_lora_rank + qk_rope_head_dim``. ``shared`` and ``none`` layers store nothing.
    """

    name: str  # preset name, path or hub id the spec was read from
    num_layers: int  # decoder layers, including those without KV
    hidden_size: int  # residual stream width
    num_attention_heads: int  # query heads
    num_kv_heads: int  # K/V heads of an attention layer (1 for MQA; unused when MLA)
    head_dim: int  # width of one K (and V) head; for MLA the query/key head width (nope + rope)
    layer_kinds: tuple[str, ...]  # one of LAYER_KINDS per layer
    dtype: str = "bfloat16"  # the config's torch dtype name: the default KV dtype
    sliding_window: int | None = None  # tokens a sliding layer keeps
    attention_chunk_size: int | None = None  # tokens per chunk of a chunked layer
    kv_lora_rank: int | None = None  # MLA latent rank r (None: not MLA)
    qk_rope_head_dim: int | None = None  # MLA decoupled RoPE key width, cached next to the latent
    model_type: str = ""  # the config's model_type
    max_position_embeddings: int | None = None  # the config's context limit, when stated
    num_parameters: int | None = None  # estimated from the config (kvlab.plan.weights), None if unknown
    num_active_parameters: int | None = None  # parameters used per token (MoE: routed experts only)
    checkpoint_bytes: int | None = None  # bytes of the safetensors weights next to the config, when read
    checkpoint_source: str | None = None  # the file(s) checkpoint_bytes was read from
    notes: tuple[str, ...] = field(default=())  # what the reader assumed or ignored, for the user

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        if len(self.layer_kinds) != self.num_layers:
            raise ValueError(
                f"`layer_kinds` must have one entry per layer ({self.num_layers}), got {len(self.layer_kinds)}"
            )
        for i, kind in enumerate(self.layer_kinds):
            if kind not in LAYER_KINDS:
                raise ValueError(f"`layer_kinds[{i}]` must be one of {LAYER_KINDS}, got {kind!r}")
        if SLIDING in self.layer_kinds and not _positive_int(self.sliding_window):
            raise ValueError(f"sliding layers need a positive `sliding_window`, got {self.sliding_window!r}")
        if CHUNKED in self.layer_kinds and not _positive_int(self.attention_chunk_size):
            raise ValueError(
                f"chunked layers need a positive `attention_chunk_size`, got {self.attention_chunk_size!r}"
            )
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ValueError(
                "MLA needs both `kv_lora_rank` and `qk_rope_head_dim`, got "
                f"{self.kv_lora_rank!r} and {self.qk_rope_head_dim!r}"
            )
        if not self.is_mla and self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"`num_key_value_heads` ({self.num_kv_heads}) must divide `num_attention_heads` "
                f"({self.num_attention_heads})"
            )
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"`dtype` must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (one cached latent per layer instead of K and V)."""
        return self.kv_lora_rank is not None

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one element in the config's dtype (the default KV cache dtype)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def gqa_group(self) -> int:
        """``g = num_attention_heads / num_kv_heads``: query heads sharing one KV head (1 = MHA)."""
        return self.num_attention_heads // self.num_kv_heads

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """Values one token adds to one KV-holding layer (all heads): ``2 * kv_heads * head_dim`` or, for MLA,
        ``kv_lora_rank + qk_rope_head_dim`` (seed 003 §3.3; DeepSeek-V2 §2.1.3)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    def count(self, kind: str) -> int:
        """Number of layers of ``kind``."""
        return sum(1 for k in self.layer_kinds if k == kind)

    @property
    def kv_layers(self) -> int:
        """Layers that store K/V of their own (full, sliding or chunked)."""
        return sum(1 for k in self.layer_kinds if k in KV_KINDS)

    def with_kv_heads(self, num_kv_heads: int) -> ModelSpec:
        """A what-if copy with another KV head count (e.g. ``num_attention_heads`` for the MHA variant)."""
        if self.is_mla:
            raise ValueError(
                "an MLA model caches a latent, not KV heads; `num_kv_heads` cannot be overridden"
            )
        return replace(
            self, num_kv_heads=num_kv_heads, notes=self.notes + (f"KV heads overridden to {num_kv_heads}",)
        )

    def summary(self) -> dict[str, Any]:
        """JSON-serializable description of the spec."""
        kinds = {k: self.count(k) for k in LAYER_KINDS if self.count(k)}
        return {
            "name": self.name,
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "layer_kinds": kinds,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_kv_heads": None if self.is_mla else self.num_kv_heads,
            "head_dim": self.head_dim,
            "mla_latent_dim": self.kv_elements_per_token_per_layer if self.is_mla else None,
            "sliding_window": self.sliding_window,
            "attention_chunk_size": self.attention_chunk_size,
            "dtype": self.dtype,
            "max_position_embeddings": self.max_position_embeddings,
            "num_parameters": self.num_parameters,
            "num_active_parameters": self.num_active_parameters,
            "notes": list(self.notes),
        }


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _field(cfg: Mapping, names: tuple[str, ...], *, required: bool = True, minimum: int = 1) -> int | None:
    """First non-null of ``names`` in ``cfg`` as an int >= ``minimum``; errors name the field."""
    for name in names:
        if name in cfg and cfg[name] is not None:
            value = cfg[name]
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value != int(value)
            ):
                raise ValueError(f"config field `{name}` must be an integer, got {value!r}")
            if int(value) < minimum:
                raise ValueError(f"config field `{name}` must be >= {minimum}, got {value!r}")
            return int(value)
    if required:
        alts = f" (nor {', '.join(f'`{n}`' for n in names[1:])})" if len(names) > 1 else ""
        raise ValueError(f"config has no `{names[0]}`{alts}")
    return None


def decoder_config(config: Mapping) -> tuple[dict, list[str]]:
    """The decoder part of a config: ``text_config`` (or ``llm_config``) of a multimodal model, else the config.

    Returns ``(decoder_dict, notes)``; the outer ``torch_dtype``/``dtype`` is inherited when the inner one is
    missing.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"a config must be a JSON object (dict), got {type(config).__name__}")
    for key in ("text_config", "llm_config", "language_config"):
        inner = config.get(key)
        if inner is None:
            continue
        if not isinstance(inner, Mapping):
            raise ValueError(f"config field `{key}` must be an object, got {inner!r}")
        merged = dict(inner)
        for dkey in ("torch_dtype", "dtype"):
            if merged.get(dkey) is None and config.get(dkey) is not None:
                merged[dkey] = config[dkey]
        note = f"decoder read from `{key}`; other towers (vision, audio) are not counted"
        return merged, [note]
    return dict(config), []


def _dtype_name(cfg: Mapping, notes: list[str]) -> str:
    for key in ("dtype", "torch_dtype"):
        value = cfg.get(key)
        if value is None:
            continue
        name = str(value).removeprefix("torch.")
        if name not in DTYPE_BYTES:
            raise ValueError(f"config field `{key}` must be a float dtype name, got {value!r}")
        return name
    notes.append("config states no dtype; bfloat16 assumed")
    return "bfloat16"


def _kv_heads(cfg: Mapping, num_heads: int) -> int:
    if cfg.get("new_decoder_architecture"):  # Falcon-40B style: grouped KV heads in `num_kv_heads`
        return _field(cfg, ("num_kv_heads", "num_key_value_heads"))
    if cfg.get("multi_query"):  # Falcon-7B, GPT-BigCode: one shared KV head
        return 1
    value = _field(cfg, ("num_key_value_heads", "num_kv_heads", "n_head_kv"), required=False)
    return num_heads if value is None else value


def _map_layer_types(values: Any, key: str, num_layers: int) -> list[str]:
    if not isinstance(values, list | tuple) or len(values) != num_layers:
        got = len(values) if isinstance(values, list | tuple) else values
        raise ValueError(f"config field `{key}` must list one entry per layer ({num_layers}), got {got!r}")
    kinds = []
    for i, value in enumerate(values):
        kind = _LAYER_TYPE_KIND.get(str(value).lower())
        if kind is None:
            raise ValueError(f"config field `{key}[{i}]` is not a known layer type, got {value!r}")
        kinds.append(kind)
    return kinds


def _layer_kinds(cfg: Mapping, num_layers: int, window: int | None, notes: list[str]) -> list[str]:
    """One kind per layer from the config's layer-type fields (see the module docstring for the rules)."""
    model_type = str(cfg.get("model_type", ""))
    if cfg.get("layer_types") is not None:
        return _map_layer_types(cfg["layer_types"], "layer_types", num_layers)
    if isinstance(cfg.get("layers_block_type"), list | tuple):
        return _map_layer_types(cfg["layers_block_type"], "layers_block_type", num_layers)
    if cfg.get("hybrid_override_pattern") is not None:
        pattern = cfg["hybrid_override_pattern"]
        if not isinstance(pattern, str) or len(pattern) != num_layers:
            raise ValueError(
                f"config field `hybrid_override_pattern` must be a string of {num_layers} characters, got {pattern!r}"
            )
        for i, ch in enumerate(pattern):
            if ch not in _PATTERN_KIND:
                raise ValueError(
                    f"config field `hybrid_override_pattern[{i}]` must be one of '*M-E', got {ch!r}"
                )
        return [_PATTERN_KIND[ch] for ch in pattern]
    if cfg.get("attn_layer_period") is not None:  # Jamba: attention every `period`-th layer
        period = _field(cfg, ("attn_layer_period",))
        offset = _field(cfg, ("attn_layer_offset",), required=False, minimum=0) or 0
        if offset >= period:
            raise ValueError(
                f"config field `attn_layer_offset` must be < attn_layer_period ({period}), got {offset}"
            )
        return [FULL if i % period == offset else NO_KV for i in range(num_layers)]
    if window is None:
        return [FULL] * num_layers
    pattern = _field(cfg, ("sliding_window_pattern", "_sliding_window_pattern"), required=False)
    if pattern is not None:  # Gemma 3: every `pattern`-th layer is global
        return [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    if model_type == "gemma2":  # Gemma 2: alternating, layer 0 sliding
        return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]
    if model_type in ("gemma3", "gemma3_text"):
        return [SLIDING if (i + 1) % 6 else FULL for i in range(num_layers)]
    if cfg.get("max_window_layers") is not None:  # Qwen2 family: layers >= max_window_layers slide
        first = _field(cfg, ("max_window_layers",), minimum=0)
        return [SLIDING if i >= first else FULL for i in range(num_layers)]
    notes.append(f"`sliding_window` {window} applied to every layer (no per-layer pattern in the config)")
    return [SLIDING] * num_layers


def _sliding_window(cfg: Mapping, notes: list[str]) -> int | None:
    window = _field(cfg, ("sliding_window",), required=False)
    if window is None:
        return None
    model_type = str(cfg.get("model_type", ""))
    use = cfg.get("use_sliding_window")
    # Qwen2-family configs carry a `sliding_window` that is off unless `use_sliding_window` is true.
    if use is False or (use is None and model_type.startswith("qwen") and cfg.get("layer_types") is None):
        notes.append(f"`sliding_window` {window} is off (`use_sliding_window` is {use!r}): all layers full")
        return None
    return window


def spec_from_config(config: Mapping, name: str = "config") -> ModelSpec:
    """Read a :class:`ModelSpec` from a transformers config dict.

    Args:
        config: the parsed ``config.json`` (nested ``text_config`` is used for multimodal models; GPT-2 names
            ``n_layer``/``n_embd``/``n_head`` are understood).
        name: what to call the model in reports.

    Raises:
        ValueError: a missing or malformed field; the message names it.
    """
    from kvlab.plan.weights import estimate_parameters  # local: weights imports this module

    cfg, notes = decoder_config(config)
    num_layers = _field(cfg, ("num_hidden_layers", "n_layer", "num_layers", "n_layers"))
    hidden = _field(cfg, ("hidden_size", "n_embd", "d_model"))
    heads = _field(cfg, ("num_attention_heads", "n_head", "num_heads"))
    kv_heads = _kv_heads(cfg, heads)

    kv_lora_rank = _field(cfg, ("kv_lora_rank",), required=False)
    rope_dim = None
    if kv_lora_rank is not None:
        rope_dim = _field(cfg, ("qk_rope_head_dim",))
        nope = _field(cfg, ("qk_nope_head_dim",), required=False, minimum=0) or 0
        head_dim = nope + rope_dim
        notes.append(
            f"MLA: one latent of {kv_lora_rank} + {rope_dim} values per token per layer, not K and V"
        )
    else:
        head_dim = _field(cfg, ("head_dim",), required=False)
        derived = hidden // heads if hidden % heads == 0 else None
        if head_dim is None:
            if derived is None:
                raise ValueError(
                    f"config has no `head_dim` and `hidden_size` ({hidden}) is not divisible by "
                    f"`num_attention_heads` ({heads})"
                )
            head_dim = derived
        elif head_dim != hidden / heads:
            notes.append(
                f"head_dim {head_dim} read from the config (hidden_size / heads would give {hidden / heads:g})"
            )
        if heads % kv_heads:
            raise ValueError(
                f"config field `num_key_value_heads` ({kv_heads}) must divide `num_attention_heads` ({heads})"
            )

    window = _sliding_window(cfg, notes)
    kinds = _layer_kinds(cfg, num_layers, window, notes)
    if SLIDING in kinds and window is None:
        raise ValueError("config lists sliding layers but `sliding_window` is null or off")
    chunk = None
    if CHUNKED in kinds:
        chunk = _field(cfg, ("attention_chunk_size",))
    shared = _field(cfg, ("num_kv_shared_layers",), required=False, minimum=0) or 0
    if shared:
        if shared >= num_layers:
            raise ValueError(
                f"config field `num_kv_shared_layers` must be < {num_layers} layers, got {shared}"
            )
        kinds = kinds[: num_layers - shared] + [
            SHARED if k != NO_KV else NO_KV for k in kinds[num_layers - shared :]
        ]
        notes.append(f"last {shared} layers reuse earlier layers' K/V (`num_kv_shared_layers`): not charged")
    no_kv = kinds.count(NO_KV)
    if no_kv:
        notes.append(
            f"{no_kv} of {num_layers} layers hold no per-token KV (Mamba/linear/MLP); their fixed per-sequence "
            "state is not counted"
        )
    if not any(k in KV_KINDS for k in kinds):
        raise ValueError("config describes no layer that stores K/V")

    params = estimate_parameters(cfg, kinds)
    notes.extend(params.notes)
    if cfg.get("quantization_config") is not None or config.get("quantization_config") is not None:
        qc = cfg.get("quantization_config") or config.get("quantization_config")
        method = qc.get("quant_method", "?") if isinstance(qc, Mapping) else qc
        notes.append(
            f"checkpoint is quantized ({method}); weight bytes from the parameter count assume one dtype for "
            "all weights: pass --weight-dtype or --weights-index"
        )
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        layer_kinds=tuple(kinds),
        dtype=_dtype_name(cfg, notes),
        sliding_window=window if SLIDING in kinds else None,
        attention_chunk_size=chunk,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope_dim,
        model_type=str(cfg.get("model_type", "")),
        max_position_embeddings=_field(
            cfg, ("max_position_embeddings", "n_positions", "max_sequence_length"), required=False
        ),
        num_parameters=params.total,
        num_active_parameters=params.active,
        notes=tuple(notes),
    )


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _looks_like_path(text: str) -> bool:
    """``./x``, ``../x``, ``/x``, ``~/x``, ``x/`` or ``*.json``: meant as a local path, never a preset or hub id."""
    return text.startswith(("./", "../", "/", "~", ".\\", "..\\")) or text.endswith(("/", "\\", ".json"))


def load_spec(model: str | os.PathLike | Mapping | ModelSpec) -> ModelSpec:
    """Resolve ``model`` to a :class:`ModelSpec`.

    ``model`` may be a :class:`ModelSpec`, a config dict, a preset name or its hub id (case-insensitive, see
    :mod:`kvlab.plan.presets`), a ``config.json`` path, a model directory (its safetensors weights, when present,
    set :attr:`ModelSpec.checkpoint_bytes`), or a hub id (``org/name``) whose ``config.json`` is fetched with
    ``huggingface_hub`` when that package is importable (cached copy first; online only when allowed).

    Raises:
        ValueError: nothing matches ``model`` (a path-like ``model``, see :func:`_looks_like_path`, that does not
            exist is reported as a missing directory or config file, never looked up on the hub), or the config
            is malformed (the message names the field).
    """
    from kvlab.plan import presets
    from kvlab.plan.weights import read_safetensors_bytes

    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return spec_from_config(model, name=str(model.get("_name_or_path") or "config"))
    text = os.fspath(model)
    if not text.strip():
        raise ValueError(f"`model` must name a preset, a config.json, a directory or a hub id, got {text!r}")
    preset = presets.find(text)
    if preset is not None:
        return spec_from_config(preset.config, name=preset.name)
    path = Path(text).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ValueError(f"directory {path} has no config.json")
        spec = spec_from_config(_read_json(config_path), name=str(path))
        found = read_safetensors_bytes(path)
        if found is not None:
            spec = replace(spec, checkpoint_bytes=found[0], checkpoint_source=found[1])
        return spec
    if path.is_file():
        return spec_from_config(_read_json(path), name=str(path))
    if _looks_like_path(text):
        kind = "config file" if text.lower().endswith(".json") else "model directory"
        raise ValueError(f"{kind} {text!r} does not exist (looked for {path.resolve()})")
    if _HUB_ID.match(text):
        return spec_from_config(_hub_config(text), name=text)
    raise ValueError(
        f"model {text!r} is not a preset, a config.json, a directory or a hub id; presets: {', '.join(presets.names())}"
    )


def _hub_config(repo_id: str) -> dict:
    """``config.json`` of a hub model via ``huggingface_hub`` (never required: a clear error without it)."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as e:
        raise ValueError(
            f"{repo_id!r} looks like a hub id but huggingface_hub is not installed; pass a config.json path"
        ) from e
    try:
        path = hf_hub_download(repo_id, "config.json", local_files_only=True)
    except Exception:
        try:
            path = hf_hub_download(repo_id, "config.json")
        except Exception as e:
            raise ValueError(f"could not fetch config.json of {repo_id!r} from the hub: {e}") from e
    return _read_json(Path(path))
