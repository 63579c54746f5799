"""Lexically constrained beam search (transformer.decoding.constraints): every phrase in the
output, in order where asked; exactly the plain search without constraints; the length
limit's fallback; the banks' striping; the translator's, command's and server's checks."""

from __future__ import annotations

import random

import pytest
import torch
from test_search import random_batch, random_model

from transformer.cli import translate as translate_command
from transformer.decoding.constraints import stripe
from transformer.decoding.corpus import search_corpus
from transformer.decoding.request import DecodingRequest, RequestError, Sampling
from transformer.decoding.search import beam_search
from transformer.decoding.translator import Translator
from transformer.errors import DataError
from transformer.model.ensemble import Ensemble

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def contains(tokens: list[int], phrase: list[int]) -> int:
    """Where `phrase` first occurs in `tokens` (-1: nowhere)."""
    for i in range(len(tokens) - len(phrase) + 1):
        if tokens[i:i + len(phrase)] == phrase:
            return i
    return -1


def random_constraints(batch: int, seed: int, most: int = 2) -> list[list[list[int]]]:
    rng = random.Random(seed)
    return [[[rng.randrange(4, 50) for _ in range(rng.randint(1, 3))]
             for _ in range(rng.randint(0, most))] for _ in range(batch)]


@pytest.fixture(scope="module")
def model():
    return random_model(eos_logit=2.5)


@pytest.mark.parametrize("beam_size", [1, 3, 5])
def test_every_phrase_appears(model, beam_size):
    src, lens = random_batch(batch=16)
    constraints = random_constraints(16, seed=beam_size)
    request = DecodingRequest(beam_size=beam_size, nbest=beam_size, max_len_b=20)
    for sentence, phrases in zip(beam_search(model, src, lens, request,
                                             constraints=constraints), constraints, strict=True):
        for hyp in sentence:
            assert hyp.constraints_met
            assert all(contains(hyp.tokens, phrase) >= 0 for phrase in phrases)


def test_an_ensemble_meets_its_constraints(model):
    ensemble = Ensemble([model, random_model(seed=5, eos_logit=2.5)])
    src, lens = random_batch(batch=8)
    constraints = random_constraints(8, seed=11)
    hyps = beam_search(ensemble, src, lens, DecodingRequest(beam_size=3, max_len_b=20),
                       constraints=constraints)
    for sentence, phrases in zip(hyps, constraints, strict=True):
        assert all(contains(sentence[0].tokens, phrase) >= 0 for phrase in phrases)


def test_ordered_phrases_appear_in_order(model):
    src, lens = random_batch(batch=12)
    constraints = random_constraints(12, seed=7, most=3)
    request = DecodingRequest(beam_size=4, max_len_b=24, ordered_constraints=True)
    hyps = beam_search(model, src, lens, request, constraints=constraints)
    for sentence, phrases in zip(hyps, constraints, strict=True):
        tokens, at = sentence[0].tokens, 0
        for phrase in phrases:  # each phrase found after the previous one
            found = contains(tokens[at:], phrase)
            assert found >= 0, (tokens, phrases)
            at += found + len(phrase)


def test_without_constraints_the_plain_search(model):
    src, lens = random_batch(batch=12)
    request = DecodingRequest(beam_size=4, nbest=2)
    plain = beam_search(model, src, lens, request)
    assert beam_search(model, src, lens, request, constraints=[[]] * 12) == plain
    # sentences without constraints in a batch with some: searched as without
    constraints = [[[9, 10]] if i % 3 == 0 else [] for i in range(12)]
    mixed = beam_search(model, src, lens, request, constraints=constraints)
    assert [mixed[i] for i in range(12) if i % 3] == [plain[i] for i in range(12) if i % 3]


def test_the_greedy_output_as_constraint_gives_it_again(model):
    """Beam 1: the greedy path produces the phrase from its first step, so it is the best of
    the fullest bank at every step, and its EOS ends it once the phrase is complete."""
    src, lens = random_batch(batch=10)
    request = DecodingRequest(beam_size=1)
    greedy = [h[0].tokens for h in beam_search(model, src, lens, request)]
    constraints = [[tokens] if tokens else [] for tokens in greedy]
    again = beam_search(model, src, lens, request, constraints=constraints)
    assert [h[0].tokens for h in again] == greedy


def test_unreachable_constraints_give_the_best_without_them(model):
    src, lens = random_batch(batch=4)
    request = DecodingRequest(beam_size=3, max_len_a=0, max_len_b=2)
    hyps = beam_search(model, src, lens, request, constraints=[[[5, 6, 7]]] * 4)
    assert all(not sentence[0].constraints_met and len(sentence[0].tokens) <= 2
               for sentence in hyps)


def test_scores_are_the_models_log_probs(model):
    """A constrained hypothesis's log-prob is the model's, as in the plain search: its
    forced decoding (the uncached search) gives the same tokens and scores."""
    src, lens = random_batch(batch=8)
    constraints = random_constraints(8, seed=3)
    cached = beam_search(model, src, lens, DecodingRequest(beam_size=3, max_len_b=20),
                         constraints=constraints)
    uncached = beam_search(model, src, lens, DecodingRequest(beam_size=3, max_len_b=20,
                                                             use_cache=False),
                           constraints=constraints)
    assert [[h.tokens for h in s] for s in cached] == [[h.tokens for h in s] for s in uncached]
    for a, b in zip(cached, uncached, strict=True):
        assert [h.log_prob for h in a] == pytest.approx([h.log_prob for h in b], abs=1e-4)
    sources = [row[:n].tolist() for row, n in zip(src, lens, strict=True)]
    batched = search_corpus(model, sources, DecodingRequest(beam_size=3, max_len_b=20),
                            constraints=constraints, max_tokens=10)
    assert [[h.tokens for h in s] for s in batched] == [[h.tokens for h in s] for s in cached]


def test_stripe_takes_the_banks_in_turn():
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, float("-inf")]])
    bank = torch.tensor([[0, 0, 2, 1, 2, 2]])
    # best of bank 2 (-3), of bank 1 (-4), of bank 0 (-1); then the second of bank 2 (-5),
    # of bank 0 (-2); -inf last
    assert stripe(scores, bank, 2).tolist() == [[2, 3, 0, 4, 1, 5]]
    assert stripe(scores, torch.zeros_like(bank), 0).tolist() == [[0, 1, 2, 3, 4, 5]]


# ---- the translator, the command and the server ---------------------------------------------

LINES = ["A man rides a bike.", "", "Two dogs play in the snow.", "A girl in a red dress."]


@pytest.fixture(scope="module")
def translator(en_de_checkpoint) -> Translator:
    return Translator.load(en_de_checkpoint, device="cpu")


def test_translator_constraints_appear_and_leave_other_lines_alone(translator):
    plain = translator.translate(LINES)
    constraints = [["Hund"], ["Katze"], [], ["rote Ball", "Frau"]]
    got = translator.translations(LINES, constraints=constraints)
    assert "Hund" in got[0][0].text and got[1][0].text == ""
    assert got[2][0].text == plain[2]
    assert "rote Ball" in got[3][0].text and "Frau" in got[3][0].text
    assert all(hyps[0].constraints_met for hyps in got)
    assert translator.translate(LINES, constraints=[[]] * len(LINES)) == plain


def test_constraints_the_length_limit_leaves_no_room_for_are_counted(translator, caplog):
    """A prefix fills the length limit: the constraint cannot follow, and the line gets its
    best translation without it, counted in a warning."""
    got = translator.translations(LINES[:1], constraints=[["Hund"]], prefixes=["Ein Mann"],
                                  max_len_a=0, max_len_b=2)
    assert not got[0][0].constraints_met and "Hund" not in got[0][0].text
    assert got[0][0].text.startswith("Ein Mann")
    assert "1 of 1 lines: no translation within the length limit" in caplog.text


def test_translator_refuses_bad_constraints_in_one_line(translator, copy_checkpoint):
    with pytest.raises(DataError, match="3 constraint lines for 4 lines"):
        translator.translate(LINES, constraints=[["Hund"]] * 3)
    with pytest.raises(DataError, match=r"constraint 2 of line 1 \(' '\) is no target piece"):
        translator.translate(LINES, constraints=[["Hund", " "], [], [], []])
    with pytest.raises(DataError, match="constraints of line 3 have .* more than the 4"):
        translator.translate(LINES, constraints=[[], [], ["ein langer Satz mit Wörtern"], []],
                             max_len_a=0, max_len_b=4)
    with pytest.raises(RequestError, match="constraints need beam search"):
        translator.translate(LINES, constraints=[["Hund"], [], [], []],
                             sampling=Sampling(topk=5))
    letters = Translator.load(copy_checkpoint, device="cpu")  # pieces of 'abcdef' only
    with pytest.raises(DataError, match="lacks .*<unk>"):
        letters.translate(["ab cd"], constraints=[["xyz"]])


def test_translate_command_constraints(en_de_checkpoint, translator, tmp_path, capsys):
    source, terms = tmp_path / "in.en", tmp_path / "terms.tsv"
    source.write_text("\n".join(LINES) + "\n")
    terms.write_text("Hund\n\n\nFrau\trote Ball\n")
    out = tmp_path / "out.de"
    assert translate_command.main(["--checkpoint", str(en_de_checkpoint), "--input",
                                   str(source), "--output", str(out), "--constraints",
                                   str(terms), "--ordered-constraints"]) == 0
    expected = translator.translate(LINES, constraints=[["Hund"], [], [], ["Frau", "rote Ball"]],
                                    ordered_constraints=True)
    assert out.read_text().splitlines() == expected
    terms.write_text("Hund\n\n")
    assert translate_command.main(["--checkpoint", str(en_de_checkpoint), "--input",
                                   str(source), "--constraints", str(terms)]) == 1
    assert "--constraints" in capsys.readouterr().err
