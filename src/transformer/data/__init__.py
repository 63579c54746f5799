"""Parallel text, from files to batches: reading and checking it (`text`), cleaning it
(`cleaning`), the tokenizers (`tokenizer`), Multi30k's files (`multi30k`), the encoded,
memory-mapped corpus (`store`), several corpora as one (`mixture`) and token-bounded batches
(`batching`)."""
