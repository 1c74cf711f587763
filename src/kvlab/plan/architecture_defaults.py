"""Defaults of the transformers config classes, for a nested ``text_config`` that leaves fields to them.

A multimodal checkpoint's ``config.json`` often writes only the fields of its language model that differ from that
architecture's config class (llava-hf/llava-v1.6-mistral-7b-hf states ``intermediate_size`` and
``num_key_value_heads`` but not the layers, width or heads). transformers and vLLM build the nested config through
the class named by its ``model_type``, so the missing fields take the class defaults. This table holds those
defaults, copied from the transformers 5.x config classes named below (torch-free: the planner never imports
transformers); :func:`kvlab.plan.config_fields.decoder_config` fills a ``text_config`` from it and notes each field
it filled.
"""

from __future__ import annotations

from types import MappingProxyType

# The size fields a config class gives a nested ``text_config`` that leaves them out, in this order; a row's None:
# the class sets no such default (Llama's KV heads follow its query heads, most have no global head_dim)
_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "global_head_dim",
    "sliding_window",
    "max_position_embeddings",
    "vocab_size",
)
# model_type -> its transformers config class's defaults of _FIELDS, from
# transformers/models/<model>/configuration_<model>.py: MistralConfig, LlamaConfig, Qwen2Config, Gemma4TextConfig
_ROWS = {
    "mistral": (4096, 14336, 32, 32, 8, None, None, None, 4096 * 32, 32000),
    "llama": (4096, 11008, 32, 32, None, None, None, None, 2048, 32000),
    "qwen2": (4096, 22016, 32, 32, 32, None, None, None, 32768, 151936),
    "gemma4_text": (2304, 9216, 30, 8, 4, 256, 512, 512, 131_072, 262_144),
}
# model_type -> field -> default
ARCHITECTURE_DEFAULTS: MappingProxyType = MappingProxyType(
    {
        model_type: MappingProxyType({f: v for f, v in zip(_FIELDS, row, strict=True) if v is not None})
        for model_type, row in _ROWS.items()
    }
)


def fill_defaults(inner: dict, key: str) -> list[str]:
    """Fill ``inner`` (a nested ``text_config``, changed in place) from its ``model_type``'s class defaults.

    Returns the notes: one naming every field filled, none when the model type is not in the table or nothing
    was missing. A field present with the value null stays null (the config chose it).
    """
    defaults = ARCHITECTURE_DEFAULTS.get(str(inner.get("model_type", "")))
    if defaults is None:
        return []
    filled = [name for name in defaults if name not in inner]
    for name in filled:
        inner[name] = defaults[name]
    if not filled:
        return []
    listed = ", ".join(f"{name} {defaults[name]}" for name in filled)
    return [
        f"`{key}` leaves fields to {inner['model_type']}'s config class defaults (transformers): {listed}"
    ]
