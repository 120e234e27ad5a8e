"""Pages of the documentation site generated at build time (``mkdocs_hooks.py`` calls them)."""
