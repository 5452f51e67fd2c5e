"""hypothesis, imported when a strategy of :mod:`samplers.testing` is made (never at import)."""

from __future__ import annotations

__all__ = ["_require_hypothesis"]


def _require_hypothesis() -> None:
    """Import hypothesis, or raise an ImportError that says how to get it."""
    try:
        import hypothesis  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "samplers.testing's strategies need hypothesis: pip install hypothesis  "
            "(or: pip install 'llama-cffi[test]')"
        ) from e
