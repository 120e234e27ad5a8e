"""FAKE ``lightning_habana.pytorch.accelerator``."""

from typing import Any

#: registries the fake classes were asked to register into (they register nothing)
REGISTERED: list[tuple[str, Any]] = []


class HPUAccelerator:
    fake = True

    @classmethod
    def register_accelerators(cls, registry: Any) -> None:
        REGISTERED.append(("accelerators", registry))

    @staticmethod
    def is_available() -> bool:
        """No Gaudi device here (Lightning 2.5.0-2.5.5 asks when choosing an accelerator)."""
        return False
