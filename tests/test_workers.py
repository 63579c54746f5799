"""Search processes (`decoding.workers`, `Translator.load(..., workers=N)`, `--workers`): the
same translations as a search in this process, every batch searched, the pieces a request of
few batches is dealt into, and the errors of a process that cannot load or ends.

The model: `en_de_checkpoint` (conftest.py), en->de trained on the Multi30k slice.
"""

from __future__ import annotations

import functools
import gzip
import os
import signal

import pytest
import torch
from conftest import MULTI30K_SLICE, assert_one_line, run_command

from transformer.data.batching import dealt
from transformer.decoding.request import DecodingRequest, RequestError, Sampling, check_workers
from transformer.decoding.search import BatchJob, search_batch
from transformer.decoding.translator import Translator
from transformer.decoding.workers import SearchWorkers
from transformer.deploy.engines import load_translator
from transformer.errors import SearchProcessError

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def lines() -> list[str]:
    with gzip.open(MULTI30K_SLICE / "val.en.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][:24]


@pytest.fixture(scope="module")
def in_process(en_de_checkpoint) -> Translator:
    return Translator.load(en_de_checkpoint, device="cpu", threads=1)


@pytest.fixture(scope="module")
def with_workers(en_de_checkpoint):
    translator = Translator.load(en_de_checkpoint, device="cpu", threads=1, workers=2)
    yield translator
    translator.close()


# ---- a request's batches dealt to the processes -----------------------------------------------

def test_dealt_cuts_fewer_batches_into_a_piece_per_process():
    batch = list(range(9))  # sentence indices, longest first
    pieces = dealt([batch], 2)
    assert pieces == [[0, 2, 4, 6, 8], [1, 3, 5, 7]]  # taken in turn: the same longest ones
    four = dealt([batch, [9, 10]], 4)
    assert len(four) == 4 and sorted(i for piece in four for i in piece) == list(range(11))
    assert all(piece == sorted(piece) for piece in four)  # each longest first, as packed


def test_dealt_leaves_enough_batches_and_single_sentences_alone():
    batches = [[0, 1], [2, 3], [4]]
    assert dealt(batches, 3) == batches and dealt(batches, 2) == batches
    assert dealt([[0]], 4) == [[0]]  # one sentence: no piece to cut
    assert dealt([], 2) == []


# ---- the same translations --------------------------------------------------------------------

def test_a_process_searches_a_batch_as_this_process_does(with_workers, in_process, lines):
    """The same code on the same model, both on one thread: bit for bit."""
    sources = in_process.encode_sources(lines[:6], None)
    job = BatchJob(sources, None, None, 0)
    for request in (DecodingRequest(beam_size=4, nbest=2),
                    DecodingRequest(beam_size=1, sampling=Sampling(topk=10, seed=3))):
        assert with_workers.workers.search(job, request) == search_batch(
            in_process.model, job, request)


def test_translations_with_workers_are_those_of_one_process(with_workers, in_process, lines):
    """Beam search in pieces of the request (other batches: the same texts, scores within
    rounding); sampling in the batches this process makes (the same draws)."""
    text = lines + [""]
    prefixes = ["Ein" if i % 3 == 0 else "" for i in range(len(text))]
    for options in ({"beam_size": 4, "nbest": 2}, {"beam_size": 4, "prefixes": prefixes},
                    {"beam_size": 3, "constraints": [["Mann"]] + [[]] * (len(text) - 1)}):
        ours = with_workers.translations(text, **options)
        theirs = in_process.translations(text, **options)
        assert [[t.text for t in s] for s in ours] == [[t.text for t in s] for s in theirs]
        assert [t.score for s in ours for t in s] == pytest.approx(
            [t.score for s in theirs for t in s], rel=1e-5)
    sampled = {"sampling": Sampling(topk=10, seed=5), "beam_size": 1}
    assert with_workers.translations(text, **sampled) == in_process.translations(text, **sampled)


def test_every_process_searches(with_workers, in_process, lines, monkeypatch):
    """A request of one batch is dealt into a piece for each process; each searches one. A
    single sentence is searched in this process."""
    searched = []
    search = SearchWorkers.search

    def counted(self, job, request):
        searched.append(len(job.sources))
        return search(self, job, request)

    monkeypatch.setattr(SearchWorkers, "search", counted)
    with_workers.translate(lines[:10], beam_size=2)
    assert sorted(searched) == [5, 5]
    with_workers.translate(["", lines[0], ""], beam_size=2)  # one sentence: searched here
    assert sorted(searched) == [5, 5]


# ---- errors --------------------------------------------------------------------------------

def test_a_process_that_cannot_load_is_named(tmp_path):
    missing = tmp_path / "missing.pt"
    with pytest.raises(SearchProcessError, match=r"search process \d could not load its model: "
                                            r".*CheckpointError.*missing\.pt"):
        SearchWorkers(functools.partial(Translator.load, missing, "cpu"), 1)


def test_a_search_that_fails_in_a_process_is_one_line(with_workers):
    """A batch the model cannot read (an id past its vocabulary): the process's error, on
    one line; the process keeps serving."""
    vocabulary = with_workers.model.config.src_vocab_size
    with pytest.raises(SearchProcessError, match=r"search process \d failed: \w+Error") as e:
        with_workers.workers.search(BatchJob([[vocabulary + 5, 3]], None, None, 0),
                                    DecodingRequest(beam_size=2))
    assert_one_line(e.value)
    assert len(with_workers.translate(["Ein Mann.", "Eine Frau."])) == 2


def test_a_process_that_ends_is_named_and_the_translator_goes_on(en_de_checkpoint, lines):
    translator = Translator.load(en_de_checkpoint, device="cpu", threads=1, workers=1)
    process = translator.workers._processes[0]
    os.kill(process.pid, signal.SIGKILL)
    process.join()
    with pytest.raises(SearchProcessError, match=rf"search process 0 \(pid {process.pid}\) ended "
                                           r"while searching a batch, exit code -9"):
        translator.translate(lines[:3])
    with pytest.raises(SearchProcessError, match="closed"):
        translator.translate(lines[:3])
    translator.close()  # searches in this process from now on
    assert translator.workers is None and len(translator.translate(lines[:3])) == 3


def test_close_ends_the_processes(en_de_checkpoint):
    translator = Translator.load(en_de_checkpoint, device="cpu", threads=1, workers=1)
    processes = list(translator.workers._processes)
    translator.close()
    assert not any(process.is_alive() for process in processes)
    assert translator.workers is None


@pytest.mark.parametrize("workers", [-1, 257, True, 1.5])
def test_workers_out_of_range_are_refused(workers):
    with pytest.raises(RequestError, match=r"workers must be an integer in \[0, 256\]"):
        check_workers(workers, torch.device("cpu"))


def test_workers_are_a_cpu_path():
    with pytest.raises(RequestError, match="workers starts search processes of one CPU "
                                           "thread each, not for cuda"):
        check_workers(2, torch.device("cuda"))
    check_workers(0, torch.device("cuda"))  # none: any device


def test_workers_are_our_engines(en_de_checkpoint):
    with pytest.raises(RequestError, match="CTranslate2's threads search its sub-batches"):
        load_translator(en_de_checkpoint, "ctranslate2", workers=2)


def test_translate_command_names_workers(en_de_checkpoint, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("Ein Mann.\n", encoding="utf-8")
    status, err = run_command(["translate", "--checkpoint", str(en_de_checkpoint), "--input",
                               str(source), "--workers", "-1"])
    assert status == 1 and err.splitlines()[-1].startswith("error: --workers must be an "
                                                           "integer in [0, 256]"), err
