"""Python step targets for examples/quickstart.yaml (``python: digest_helpers:publish``)."""

from __future__ import annotations


def publish(sections: list[str], topic: str) -> dict[str, object]:
    """Assemble the drafted sections into a digest."""
    body = "\n\n".join(sections)
    return {"title": f"A digest of {topic}", "sections": len(sections), "characters": len(body)}
