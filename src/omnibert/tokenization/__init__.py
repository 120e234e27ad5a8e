"""BERT tokenisation, shared by offline preparation and fine-tuning: ``vocab.txt`` with the
reference's semantics (:mod:`~omnibert.tokenization.vocab`), the reference's basic and
WordPiece tokenizers (:mod:`~omnibert.tokenization.basic_tokenizer`) and the fast tokenizer
that gives exactly their tokens (:mod:`~omnibert.tokenization.bert_tokenizer`)."""
