"""The decoding request: each rule checked once, naming the field as the server spells it and
as `transformer translate` spells it; requests built from stored defaults and from the flat
options of the command line and the server."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest

from transformer.cli.translate import build_parser
from transformer.decoding.request import (
    OPTIONS,
    AlignmentOptions,
    DecodingRequest,
    RequestError,
    Sampling,
    option_name,
)
from transformer.errors import ConfigError
from transformer.run.config import DecodingSettings

BAD = [  # (the request's fields, the field the error names, words of its message)
    (dict(beam_size=0), "beam_size", r"beam_size must be in \[1, 1024\], got 0"),
    (dict(beam_size=2 ** 63, nbest=1), "beam_size", "beam_size must be in"),
    (dict(nbest=0), "nbest", "nbest must be >= 1"),
    (dict(beam_size=2, nbest=3), "nbest", "nbest 3 must be at most the beam size 2"),
    (dict(alpha=-0.5), "alpha", "alpha must be >= 0"),
    (dict(alpha=float("nan")), "alpha", "alpha must be a finite float"),
    (dict(max_len_a=float("inf")), "max_len_a", "max_len_a must be a finite float"),
    (dict(max_len_a=-1.0), "max_len_a", "max_len_a must be >= 0"),
    (dict(max_len_b=0), "max_len_b", "max_len_b must be >= 1"),
    (dict(beam_size=2.0), "beam_size", "beam_size must be a finite int, got 2.0"),
    (dict(nbest=True), "nbest", "nbest must be a finite int, got True"),
    (dict(use_cache=1), "use_cache", "use_cache must be a finite bool"),
    (dict(sampling=Sampling()), "beam_size", "sampling draws one translation per line"),
    (dict(beam_size=1, nbest=2, sampling=Sampling()), "nbest", "it excludes nbest 2"),
    (dict(target_lang=""), "target_lang", "target_lang must be a language such as de"),
    (dict(target_lang="d e"), "target_lang", r"\(letters, digits, '_', '-', '\.'\), got 'd e'"),
    (dict(target_lang="de\n"), "target_lang", r"got 'de\\n'"),
    (dict(target_lang="{0}"), "target_lang", r"got '\{0\}'"),  # a template's braces, shown
    (dict(target_lang=7), "target_lang", "got 7"),
]


@pytest.mark.parametrize("fields, field, words", BAD)
def test_a_bad_request_names_its_field(fields, field, words):
    with pytest.raises(RequestError, match=words) as info:
        DecodingRequest(**fields)
    assert info.value.field == field
    assert isinstance(info.value, ConfigError) and "\n" not in str(info.value)


@pytest.mark.parametrize("fields, field", [
    (dict(temperature=0.0), "temperature"), (dict(topk=-1), "sampling_topk"),
    (dict(topp=0.0), "sampling_topp"), (dict(topp=1.5), "sampling_topp"),
    (dict(seed=-1), "seed"), (dict(seed=2 ** 32), "seed"), (dict(topk=1.5), "sampling_topk"),
    (dict(temperature=float("inf")), "temperature")])
def test_sampling_options_are_checked(fields, field):
    with pytest.raises(RequestError, match=field) as info:
        Sampling(**fields)
    assert info.value.field == field


def test_the_command_line_names_options_as_options():
    with pytest.raises(RequestError) as info:
        DecodingRequest(beam_size=1, nbest=2, sampling=Sampling(topk=5))
    assert str(info.value) == "sampling draws one translation per line: it excludes nbest 2"
    assert (info.value.message(option_name)
            == "sampling draws one translation per line: it excludes --nbest 2")
    with pytest.raises(RequestError) as info:
        DecodingRequest.from_options(DecodingSettings(), seed=3)
    assert info.value.message(option_name) == (
        "--seed seeds sampling: give --sampling-topk, --sampling-topp or --temperature too")


def test_over_keeps_the_stored_defaults_where_nothing_is_given():
    stored = DecodingSettings(beam_size=4, alpha=2.5, max_len_a=1.2, max_len_b=7)
    assert DecodingRequest.over(stored) == DecodingRequest(beam_size=4, alpha=2.5,
                                                           max_len_a=1.2, max_len_b=7)
    assert DecodingRequest.over(stored, beam_size=2, nbest=None, alpha=0.0) == DecodingRequest(
        beam_size=2, alpha=0.0, max_len_a=1.2, max_len_b=7)
    sampled = DecodingRequest.over(stored, sampling=Sampling(seed=1))
    assert sampled.beam_size == 1 and sampled.alpha == 2.5  # sampling's beam is one line
    with pytest.raises(RequestError, match="excludes beam_size 4"):
        DecodingRequest.over(stored, beam_size=4, sampling=Sampling())


def test_from_options_builds_sampling_and_alignment_from_flat_options():
    stored = DecodingSettings()
    assert DecodingRequest.from_options(stored) == DecodingRequest()
    request = DecodingRequest.from_options(stored, temperature=0.7, seed=5, alignment=True,
                                           alignment_layer=1, alignment_head=2)
    assert request.sampling == Sampling(topk=0, topp=1.0, temperature=0.7, seed=5)
    assert request.alignment == AlignmentOptions(layer=1, head=2)
    assert request.beam_size == 1
    assert DecodingRequest.from_options(stored, target_lang="fr-CA").target_lang == "fr-CA"
    for options, field in ((dict(alignment_head=0), "alignment_head"),
                           (dict(alignment_layer=0), "alignment_layer"),
                           (dict(seed=1), "seed"),
                           (dict(beam_size=3, sampling_topk=4), "beam_size")):
        with pytest.raises(RequestError) as info:
            DecodingRequest.from_options(stored, **options)
        assert info.value.field == field


def test_alignment_options_are_checked_against_the_model():
    AlignmentOptions(layer=-2, head=3).check(2, [0, 3])
    with pytest.raises(RequestError, match=r"alignment_layer must be in \[-2, 2\)") as info:
        AlignmentOptions(layer=2).check(2, [0, 1])
    assert info.value.field == "alignment_layer"
    with pytest.raises(RequestError, match="alignment_head 1 is not a head of decoder layer 1 "
                                           r"\(heads \[0, 3\]\)"):
        AlignmentOptions(layer=-1, head=1).check(2, [0, 3])


def test_requests_are_frozen_and_derived_with_replace():
    greedy = replace(DecodingRequest(), beam_size=1, max_len_b=5)
    assert greedy == DecodingRequest(beam_size=1, max_len_b=5)
    assert hash(greedy) == hash(DecodingRequest(beam_size=1, max_len_b=5))  # server batch key
    with pytest.raises(AttributeError):
        greedy.beam_size = 3  # type: ignore[misc]
    with pytest.raises(RequestError, match="nbest"):
        replace(greedy, nbest=2)  # replace checks again


def test_the_command_and_the_server_take_the_same_options():
    """`OPTIONS` are `from_options`' parameters, `transformer translate`'s options and the
    server's fields besides the sentences, their prefixes and their constraints."""
    from transformer.deploy.serve import TranslateRequest

    parameters = inspect.signature(DecodingRequest.from_options).parameters
    assert set(OPTIONS) == set(parameters) - {"defaults"}
    assert (set(TranslateRequest.model_fields) - {"text", "prefix", "constraints"}
            == set(OPTIONS))
    args = vars(build_parser().parse_args(["--checkpoint", "x.pt"]))
    assert set(OPTIONS) <= set(args)
