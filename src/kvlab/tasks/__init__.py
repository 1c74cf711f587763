"""RULER-style long-context tasks (torch-free): seeded generators with exact token lengths and RULER's scoring.

* :mod:`kvlab.tasks.tokens`: the tokenizer protocol (``encode`` / ``decode``) and a Hugging Face adapter;
* :mod:`kvlab.tasks.haystack`: the noise and natural-text haystacks, keys, numbers, UUIDs, words;
* :mod:`kvlab.tasks.generators`: the tasks (:data:`~kvlab.tasks.generators.TASKS`) and
  :func:`~kvlab.tasks.generators.generate`;
* :mod:`kvlab.tasks.scoring`: ``string_match_all`` / ``string_match_part``.

Sources: RULER (Hsieh et al. 2024, arXiv:2404.06654; ``NVIDIA/RULER/scripts/synthetic.yaml``, Apache-2.0) and InfiniteBench
(Zhang et al. 2024, arXiv:2402.13718). ``kvlab.eval.tasks_run`` runs them through KV caches (docs/TASKS.md).
"""

from kvlab.tasks.generators import DEPTHS, TASKS, NotPlaceable, Question, Sample, generate
from kvlab.tasks.haystack import Haystack, noise_haystack, text_haystack
from kvlab.tasks.scoring import sample_score, string_match_all, string_match_part
from kvlab.tasks.tokens import Tokenizer, as_tokenizer

__all__ = [
    "DEPTHS",
    "TASKS",
    "Haystack",
    "NotPlaceable",
    "Question",
    "Sample",
    "Tokenizer",
    "as_tokenizer",
    "generate",
    "noise_haystack",
    "sample_score",
    "string_match_all",
    "string_match_part",
    "text_haystack",
]
