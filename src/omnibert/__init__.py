"""omnibert: BERT pretraining and fine-tuning on any accelerator."""

__version__ = "0.1.0"
