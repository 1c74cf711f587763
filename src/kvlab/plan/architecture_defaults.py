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

# model_type -> the size fields of its transformers config class's defaults (class named in the comment)
ARCHITECTURE_DEFAULTS: MappingProxyType = MappingProxyType(
    {
        # MistralConfig (transformers/models/mistral/configuration_mistral.py)
        "mistral": MappingProxyType(
            dict(
                hidden_size=4096,
                intermediate_size=14336,
                num_hidden_layers=32,
                num_attention_heads=32,
                num_key_value_heads=8,
                max_position_embeddings=4096 * 32,
                vocab_size=32000,
            )
        ),
        # LlamaConfig (transformers/models/llama/configuration_llama.py)
        "llama": MappingProxyType(
            dict(
                hidden_size=4096,
                intermediate_size=11008,
                num_hidden_layers=32,
                num_attention_heads=32,
                max_position_embeddings=2048,
                vocab_size=32000,
            )
        ),
        # Qwen2Config (transformers/models/qwen2/configuration_qwen2.py)
        "qwen2": MappingProxyType(
            dict(
                hidden_size=4096,
                intermediate_size=22016,
                num_hidden_layers=32,
                num_attention_heads=32,
                num_key_value_heads=32,
                max_position_embeddings=32768,
                vocab_size=151936,
            )
        ),
        # Gemma4TextConfig (transformers/models/gemma4/configuration_gemma4.py)
        "gemma4_text": MappingProxyType(
            dict(
                hidden_size=2304,
                intermediate_size=9216,
                num_hidden_layers=30,
                num_attention_heads=8,
                num_key_value_heads=4,
                head_dim=256,
                global_head_dim=512,
                sliding_window=512,
                max_position_embeddings=131_072,
                vocab_size=262_144,
            )
        ),
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
