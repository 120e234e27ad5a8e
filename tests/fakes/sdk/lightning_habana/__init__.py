"""FAKE lightning_habana for CPU tests (not the Lightning-AI/Habana package): classes with the
documented constructor signatures that record their arguments; they cannot train."""
