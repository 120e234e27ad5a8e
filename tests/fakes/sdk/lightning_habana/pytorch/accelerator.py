"""FAKE ``lightning_habana.pytorch.accelerator``."""


class HPUAccelerator:
    fake = True
