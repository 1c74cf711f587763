"""The parts of ``scripts/train_reference.py`` (a script's helpers, not part of the kvlab package):

``data``       the corpus (Debian's Python documentation), its split by file, the tokenizer, the token streams and
               the curriculum of window shapes
``mixture``    long-range tasks (copies, passkeys) written over the text windows, and the mixture's description
``loop``       the Qwen2 config, block expansion, the learning-rate schedule, the weighted loss, the training loop
               and the held-out NLL
``abilities``  copy and passkey abilities with kvlab eval's probes (:mod:`kvlab.eval.longctx`): the card's tables,
               the training log's monitor, a packaged model measured again
``card``       ``MODEL_CARD.md`` from ``provenance.json``, and the package written whole, then moved into place
"""
