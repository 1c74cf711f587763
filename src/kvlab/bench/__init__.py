"""Benchmarks: one module per name, each exposing ``run(**opts) -> dict`` (JSON-serializable); ``kvlab bench``
dispatches to them. Speed targets live here, never in timed unit tests."""
