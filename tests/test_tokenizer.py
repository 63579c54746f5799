"""SentencePiece wrapper: special ids, round trip, serialization, determinism."""

from __future__ import annotations

import hashlib
import io
import unicodedata

import pytest
import sentencepiece as spm

from transformer.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    SpecialIds,
    Tokenizer,
    TokenizerPair,
)

SENTENCES = [
    "A man in an orange hat starring at something.",
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Zwei junge Männer spielen Fußball auf einer Wiese.",
    "Une femme fait du vélo dans la rue.",
]


@pytest.fixture(scope="module")
def small_corpus(multi30k_lines) -> list[str]:
    """2,000 English and 2,000 German Multi30k training sentences."""
    return multi30k_lines("train.en.gz")[:2000] + multi30k_lines("train.de.gz")[:2000]


def test_special_ids_are_fixed(multi30k_tokenizer):
    tok = multi30k_tokenizer
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert [tok.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert tok.vocab_size == 2000
    ids = tok.encode("A dog runs.")
    assert ids and not set(ids) & {PAD_ID, BOS_ID, EOS_ID}  # no BOS/EOS added


def test_round_trip_multi30k_validation(multi30k_tokenizer, multi30k_lines):
    """decode(encode(s)) == s for every validation sentence of the slice (en and de), up to the
    normalisation SentencePiece's default "nmt_nfkc" rule applies: Unicode NFKC (e.g. the
    no-break space U+00A0 becomes a space) and whitespace collapsed to single spaces, stripped
    at both ends. No <unk> may appear."""
    tok = multi30k_tokenizer
    sentences = multi30k_lines("val.en.gz") + multi30k_lines("val.de.gz")
    assert len(sentences) == 2 * 300
    encoded = tok.encode_batch(sentences)
    assert not any(UNK_ID in ids for ids in encoded)
    normalize = lambda s: " ".join(unicodedata.normalize("NFKC", s).split())
    mismatches = [s for s, ids in zip(sentences, encoded, strict=True)
                  if tok.decode(ids) != normalize(s)]
    assert mismatches == []
    # The normalisation matters for very few lines; everything else is byte-identical.
    exact = sum(tok.decode(ids) == s for s, ids in zip(sentences, encoded, strict=True))
    assert exact >= len(sentences) - 3


def test_unseen_characters_round_trip_via_byte_fallback(multi30k_tokenizer):
    text = "Ein Hund läuft: 日本語, ✓ and Ωμέγα!"
    ids = multi30k_tokenizer.encode(text)
    assert UNK_ID not in ids
    assert multi30k_tokenizer.decode(ids) == text


def test_decode_skips_pad_bos_eos(multi30k_tokenizer):
    tok = multi30k_tokenizer
    ids = tok.encode(SENTENCES[1])
    assert tok.decode([BOS_ID] + ids + [EOS_ID, PAD_ID, PAD_ID]) == SENTENCES[1]
    assert tok.decode([]) == ""


def test_encode_batch_matches_encode_and_pieces(multi30k_tokenizer):
    tok = multi30k_tokenizer
    assert tok.encode_batch(SENTENCES) == [tok.encode(s) for s in SENTENCES]
    s = SENTENCES[0]
    assert [tok.id_to_piece(i) for i in tok.encode(s)] == tok.pieces(s)
    assert "".join(tok.pieces(s)).replace("\u2581", " ").strip() == s


def test_bytes_and_file_round_trip(multi30k_tokenizer, tmp_path):
    tok = multi30k_tokenizer
    data = tok.to_bytes()
    assert isinstance(data, bytes)
    again = Tokenizer.from_bytes(data)
    assert again == tok and again.to_bytes() == data
    assert again.encode(SENTENCES[2]) == tok.encode(SENTENCES[2])
    tok.save(tmp_path / "sub" / "m.model")
    assert Tokenizer.load(tmp_path / "sub" / "m.model") == tok
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["m.model"]  # no temp file left
    with pytest.raises(FileNotFoundError, match="nope.model"):
        Tokenizer.load(tmp_path / "nope.model")


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_training_is_deterministic(model_type, small_corpus, tmp_path):
    a = Tokenizer.train(small_corpus, tmp_path / "a.model", vocab_size=500, model_type=model_type)
    b = Tokenizer.train(small_corpus, None, vocab_size=500, model_type=model_type)
    assert a.to_bytes() == b.to_bytes()
    assert (tmp_path / "a.model").read_bytes() == a.to_bytes()
    assert a.vocab_size == 500
    assert a.decode(a.encode(SENTENCES[3])) == SENTENCES[3]


def test_rejects_model_with_other_special_ids(small_corpus):
    buffer = io.BytesIO()  # SentencePiece's own defaults: unk 0, bos 1, eos 2, no pad
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(small_corpus), model_writer=buffer, vocab_size=200,
        model_type="bpe", minloglevel=2,
    )
    with pytest.raises(ValueError, match="special ids"):
        Tokenizer.from_bytes(buffer.getvalue())


def test_rejects_unknown_model_type(small_corpus):
    with pytest.raises(ValueError, match="model_type"):
        Tokenizer.train(small_corpus, vocab_size=500, model_type="word-ish")


def test_tokenizer_pair_shared(multi30k_tokenizer, small_corpus):
    joint = TokenizerPair(multi30k_tokenizer, multi30k_tokenizer)
    assert joint.shared
    other = Tokenizer.train(small_corpus, vocab_size=500, model_type="bpe")
    assert not TokenizerPair(multi30k_tokenizer, other).shared


# ---- an id table (imported Marian models) ------------------------------------------------

def marian_like(small_corpus) -> tuple[Tokenizer, list[str]]:
    """A SentencePiece model with its own ids (unk 0, bos 1, eos 2) behind an id table laid
    out as OPUS-MT's vocab.json: `</s>` 0, `<unk>` 1, the pieces, `<pad>` last."""
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(small_corpus), model_writer=buffer, vocab_size=200,
        model_type="bpe", minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=buffer.getvalue())
    left_out = sp.encode(SENTENCES[0], out_type=str)[0]  # a piece the table lacks: <unk>
    pieces = ["</s>", "<unk>"] + [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())
                                  if sp.id_to_piece(i) != left_out] + ["<pad>"]
    specials = SpecialIds(pad=len(pieces) - 1, unk=1, start=len(pieces) - 1, eos=0)
    return Tokenizer(sp, pieces, specials), pieces


def test_an_id_table_maps_pieces_and_decodes_them_back(small_corpus):
    tok, pieces = marian_like(small_corpus)
    sp = spm.SentencePieceProcessor(model_proto=tok.to_bytes())
    for sentence in SENTENCES[:3]:
        expected = [pieces.index(p) if p in pieces else 1
                    for p in sp.encode(sentence, out_type=str)]
        assert tok.encode(sentence) == expected
    assert tok.encode(SENTENCES[0])[0] == tok.specials.unk
    assert tok.vocab_size == len(pieces) and tok.vocabulary() == pieces
    ids = tok.encode(SENTENCES[0])
    assert tok.decode([tok.specials.start, *ids, tok.specials.eos, tok.specials.pad]) == \
        sp.decode_pieces([pieces[i] for i in ids])
    assert tok.encode(">>deu<< " + SENTENCES[0]) == [1, *tok.encode(" " + SENTENCES[0])]


def test_an_id_table_survives_a_checkpoint_and_changes_the_fingerprint(small_corpus):
    tok, _ = marian_like(small_corpus)
    back = Tokenizer.from_state(tok.to_state())
    assert back == tok and back.specials == tok.specials
    assert back.encode(SENTENCES[1]) == tok.encode(SENTENCES[1])
    plain_state = tok.to_bytes()
    assert tok.fingerprint != hashlib.sha256(plain_state).hexdigest()
    with pytest.raises(ValueError, match="outside the id table"):
        Tokenizer(spm.SentencePieceProcessor(model_proto=plain_state), ["a", "b"],
                  SpecialIds(pad=5, unk=0, start=5, eos=1))
