"""The Transformer as the book builds it: its layers (`layers`: Linear, Dropout), attention
(`attention`; the faster paths in `kernels`, the decoding cache in `cache`), the blocks
(`blocks`), the encoder-decoder (`transformer`), its loss (`loss`) and its int8 form
(`int8`)."""
