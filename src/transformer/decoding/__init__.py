"""Translating with a model: one typed request per call (`request`), beam search and
sampling (`search`), many sentences in batches on parallel threads (`corpus`), word
alignments (`alignment`), vocabulary maps (`vocab_map`) and the engine interface with our
engine (`translator`)."""
