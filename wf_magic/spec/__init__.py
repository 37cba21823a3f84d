"""Workflow source → authoring models → frozen plan; the Jinja sandbox."""
