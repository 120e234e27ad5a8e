"""omnibert's Hydra configs, installed as the package ``omnibert.conf`` (``pkg://omnibert.conf``).

The folder lives at the repository's top level; pyproject.toml maps it into the package, so
editable and wheel installs find the same configs."""
