"""Fine-tuning data and metrics: SQuAD v1.1 (``squad``, ``squad_metric``) and GLUE MRPC
(``glue``), tokenised with the checkpoint's own vocab (``tokenizer``). Pure Python + numpy
(torch only where tensors are handed out); the LightningModules live in ``omnibert.tasks``."""
