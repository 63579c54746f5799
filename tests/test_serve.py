"""The translation server (transformer.deploy.serve) through FastAPI's test client: answers equal
the torch Translator's own output, in input order; n-best; attention weights equal
`attention_maps`' and each row sums to 1 over the real keys; every limit and bad input gets a
4xx naming the field and the server goes on serving; no request can choose a file; the
batcher puts waiting requests into one `translate` call; `transformer serve`'s errors."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import PRUNED_HEADS  # tests/conftest.py
from fastapi.testclient import TestClient
from outputs import scored

from transformer.cli import serve as serve_command
from transformer.decoding.alignment import format_alignment
from transformer.decoding.request import AlignmentOptions, DecodingRequest, Sampling
from transformer.decoding.translator import BaseTranslator, Translator
from transformer.deploy.serve import (
    MAX_BEAM,
    MAX_BODY_BYTES,
    MAX_CHARS,
    MAX_SENTENCES,
    Batcher,
    BatchLimits,
    create_app,
)
from transformer.model.transformer import ModelConfig
from transformer.tools.attention_maps import attention_maps

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "serve.py"
LINES = ["A man rides a bike.", "Two dogs play in the snow.", "", "A girl in a red dress.",
         "Zwei Männer stehen vor einem Gebäude.", "People.", "A woman sings 😀 on a stage."]


class OtherEngine(BaseTranslator):
    """An engine that is not the torch `Translator` (as another engine's would be): it
    searches with one, records every call, and fails on the line "boom"."""

    engine = "other"

    def __init__(self, translator: Translator):
        super().__init__(translator.tokenizers, decoding=translator.decoding)
        self.inner, self.calls = translator, []

    @property
    def model_config(self) -> ModelConfig:
        return self.inner.model_config

    def translations(self, lines, request=None, **options):
        self.calls.append(list(lines))
        if "boom" in lines:
            raise RuntimeError("the engine failed")
        return super().translations(lines, request, **options)

    def _search(self, sources, request, **options):
        return self.inner._search(sources, request, **options)

    def _score(self, sources, targets, **options):
        return self.inner._score(sources, targets, **options)


@pytest.fixture(scope="module")
def translator(random_checkpoint) -> Translator:
    return Translator.load(random_checkpoint, device="cpu")


@pytest.fixture(scope="module")
def client(translator):
    with TestClient(create_app(translator)) as client:
        yield client


def error_of(response, status: int) -> str:
    """The field an error answer names, after checking its status and its message."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "field"} and body["error"] and "\n" not in body["error"]
    return body["field"]


def assert_same_nbest(got, expected):
    """n-best lists equal: texts exactly, scores up to batching's rounding."""
    assert [[text for text, _ in hyps] for hyps in got] == \
           [[text for text, _ in hyps] for hyps in expected]
    for hyps, ref in zip(got, expected, strict=True):
        assert [s for _, s in hyps] == pytest.approx([s for _, s in ref], abs=1e-4)


# ---- translations ---------------------------------------------------------------------------

def test_translations_in_input_order_equal_the_translators(client, translator):
    response = client.post("/translate", json={"text": LINES})
    assert response.status_code == 200
    assert response.json() == {"translations": translator.translate(LINES)}
    three = client.post("/translate", json={"text": LINES[:3], "beam_size": 2}).json()
    assert three["translations"] == translator.translate(LINES[:3], beam_size=2)


def test_constraints_per_sentence(client, translator):
    constraints = [["Hund"], [], [], ["rote", "Frau"], [], [], []]
    body = {"text": LINES, "constraints": constraints, "ordered_constraints": True}
    answer = client.post("/translate", json=body).json()
    expected = translator.translations(LINES, constraints=constraints, ordered_constraints=True)
    assert answer == {"translations": [hyps[0].text for hyps in expected],
                      "constraints_met": [hyps[0].constraints_met for hyps in expected]}
    assert "Hund" in answer["translations"][0]
    wrong = client.post("/translate", json={"text": LINES, "constraints": [["Hund"]]})
    assert error_of(wrong, 422) == "constraints"
    empty = client.post("/translate", json={"text": LINES[:1], "constraints": [["Hund", ""]]})
    assert error_of(empty, 422) == "constraints"
    sampled = client.post("/translate", json={"text": LINES[:1], "constraints": [["Hund"]],
                                              "sampling_topk": 3})
    assert error_of(sampled, 422) == "constraints"


def test_nbest_lists_of_text_and_score(client, translator):
    response = client.post("/translate", json={"text": LINES, "beam_size": 3, "nbest": 3})
    got = response.json()["translations"]
    assert [len(hyps) for hyps in got] == [3] * len(LINES)
    assert all(set(h) == {"text", "score"} for hyps in got for h in hyps)
    for hyps in got:
        assert [h["score"] for h in hyps] == sorted((h["score"] for h in hyps), reverse=True)
    assert_same_nbest([[(h["text"], h["score"]) for h in hyps] for hyps in got],
                      scored(translator.translations(LINES, beam_size=3, nbest=3)))


def test_sampling_prefixes_and_alignments(client, translator):
    body = {"text": LINES, "sampling_topk": 0, "temperature": 2.0, "seed": 3}
    sampled = client.post("/translate", json=body).json()["translations"]
    assert client.post("/translate", json=body).json()["translations"] == sampled
    assert sampled == translator.translate(LINES, sampling=Sampling(topk=0, temperature=2.0,
                                                                    seed=3))
    prefixes = ["Ein Hund"] * 2 + [""] * (len(LINES) - 2)
    forced = client.post("/translate", json={"text": LINES, "prefix": prefixes}).json()
    assert forced["translations"] == translator.translate(LINES, prefixes=prefixes)
    assert all(t.startswith("Ein Hund") for t in forced["translations"][:2])
    aligned = client.post("/translate", json={"text": LINES, "alignment": True}).json()
    expected = translator.translations(LINES, alignment=AlignmentOptions())
    assert aligned["translations"] == [hyps[0].text for hyps in expected]
    assert aligned["alignments"] == [format_alignment(hyps[0].alignment) for hyps in expected]
    nbest = client.post("/translate", json={"text": LINES[:2], "beam_size": 3, "nbest": 2,
                                            "alignment": True}).json()["translations"]
    assert all(set(h) == {"text", "score", "alignment"} for hyps in nbest for h in hyps)


def test_concurrent_requests_each_get_their_own_translations(client, translator):
    requests = [LINES[i:i + 1 + i % 3] for i in range(len(LINES))] * 2
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda lines: client.post("/translate", json={"text": lines}),
                                requests))
    for lines, answer in zip(requests, answers, strict=True):
        assert answer.json()["translations"] == translator.translate(lines)


def test_a_server_with_search_processes_answers_as_one_process(random_checkpoint, translator):
    """`transformer serve --workers 2`: the batches of concurrent requests are searched in
    two processes, with the translations of one."""
    with_workers = Translator.load(random_checkpoint, device="cpu", workers=2)
    try:
        with TestClient(create_app(with_workers)) as client, ThreadPoolExecutor(8) as pool:
            requests = [LINES[i:i + 1 + i % 3] for i in range(len(LINES))] * 2
            answers = list(pool.map(lambda lines: client.post("/translate",
                                                              json={"text": lines}), requests))
    finally:
        with_workers.close()
    for lines, answer in zip(requests, answers, strict=True):
        assert answer.json()["translations"] == translator.translate(lines)


def test_batcher_puts_waiting_requests_into_one_call_in_order(translator):
    """Requests waiting together share one `translate` call (those with the same options),
    each gets its own slice; a token budget splits them."""
    engine = OtherEngine(translator)
    requests = [(["A man.", "A dog."], 2), (["Two cats."], 2), (["A boy."], 3),
                (["A red car.", "", "Hi."], 2), (["Snow."], 2)]

    async def run(limits: BatchLimits, tokens: int) -> list:
        with ThreadPoolExecutor(1) as executor:
            batcher = Batcher(engine, executor, limits)
            batcher.start()
            answers = await asyncio.gather(*(batcher.translate(lines, None,
                                                               DecodingRequest(beam_size=beam),
                                                               tokens)
                                             for lines, beam in requests))
            await batcher.stop()
        assert batcher.stats.batches == len(engine.calls)
        return answers

    answers = asyncio.run(run(BatchLimits(max_wait_s=0.05), tokens=1))
    assert engine.calls == [["A man.", "A dog.", "Two cats.", "A red car.", "", "Hi.", "Snow."],
                            ["A boy."]]
    for (lines, beam), answer in zip(requests, answers, strict=True):
        assert_same_nbest([[(t.text, t.score) for t in hyps] for hyps in answer],
                          scored(translator.translations(lines, beam_size=beam)))

    engine.calls.clear()
    asyncio.run(run(BatchLimits(max_wait_s=0.05, max_tokens=10), tokens=6))
    assert engine.calls == [lines for lines, _ in requests]  # 6 + 6 > 10: one request a batch


class GatedEngine(OtherEngine):
    """`OtherEngine` whose first call waits until the test opens `gate`, telling it by
    `entered` that the call has begun."""

    def __init__(self, translator: Translator):
        super().__init__(translator)
        self.entered, self.gate = threading.Event(), threading.Event()

    def translations(self, lines, request=None, **options):
        if not self.entered.is_set():
            self.entered.set()
            self.gate.wait()
        return super().translations(lines, request, **options)


def test_batcher_waits_for_more_under_load_only(translator):
    """A lone request at an idle server is translated at once, whatever `max_wait_s` (here
    an hour: had the batcher waited for others, the engine would not have been called
    within a minute); a request that arrives while a batch is translated waits for others,
    until the token budget is full."""
    engine = GatedEngine(translator)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as executor:
            batcher = Batcher(engine, executor, BatchLimits(max_wait_s=3600, max_tokens=10))
            batcher.start()
            request = DecodingRequest(beam_size=2)
            first = asyncio.ensure_future(batcher.translate(["A man."], None, request, 5))
            assert await loop.run_in_executor(None, engine.entered.wait, 60)  # "A man." alone
            second = asyncio.ensure_future(batcher.translate(["A dog."], None, request, 5))
            await asyncio.sleep(0)  # queued while the model is busy
            engine.gate.set()
            await asyncio.wait_for(first, 60)
            third = asyncio.ensure_future(batcher.translate(["Two cats."], None, request, 5))
            await asyncio.wait_for(asyncio.gather(second, third), 60)  # 5 + 5 fill the budget
            await batcher.stop()

    asyncio.run(run())
    assert engine.calls == [["A man."], ["A dog.", "Two cats."]]


# ---- attention ------------------------------------------------------------------------------

def check_attention(report: dict, translator: Translator, text: str) -> None:
    """Shapes, rows summing to 1 over the real keys (causal for decoder self-attention) and
    the weights of `attention_maps` itself."""
    assert report["translation"] == translator.translate([text])[0]
    tokenizers = translator.tokenizers
    src_ids = tokenizers.src.encode(text)
    tgt_ids = tokenizers.tgt.encode(report["translation"])
    expected = attention_maps(translator.model, src_ids, tgt_ids)
    assert report["labels"]["enc-self"]["keys"] == \
           [tokenizers.src.id_to_piece(i) for i in src_ids] + ["</s>"]
    assert len(report["layers"]) == len(expected) == 6  # 2 encoder + 2 x 2 decoder
    for layer in report["layers"]:
        labels = report["labels"][layer["kind"]]
        weights = torch.tensor(layer["weights"], dtype=torch.float64)
        assert weights.shape == (len(layer["heads"]), len(labels["queries"]),
                                 len(labels["keys"]))
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:2],
                                                               dtype=torch.float64), atol=1e-4,
                                   rtol=0)
        if layer["kind"] == "dec-self":  # position i reads <s> and the pieces before it
            assert (weights.triu(1) == 0).all()
        torch.testing.assert_close(weights, expected[layer["name"]].double(), atol=1e-5, rtol=0)
        pruned = PRUNED_HEADS.get(layer["name"], []) if translator.model.config.pruned_heads \
            else []
        assert layer["heads"] == [h for h in range(4) if h not in pruned]


def test_attention_of_every_layer_and_head(client, translator):
    text = "Two dogs play in the snow."
    response = client.post("/attention", json={"text": text})
    assert response.status_code == 200
    report = response.json()
    assert report["num_heads"] == 4 and set(report["kinds"]) == {"enc-self", "dec-self",
                                                                 "enc-dec"}
    check_attention(report, translator, text)


def test_attention_of_a_pruned_model_leaves_its_heads_out(pruned_checkpoint):
    pruned = Translator.load(pruned_checkpoint, device="cpu")
    with TestClient(create_app(pruned)) as client:
        text = "A man in a blue shirt."
        check_attention(client.post("/attention", json={"text": text}).json(), pruned, text)


def test_another_engine_translates_but_has_no_attention(translator):
    engine = OtherEngine(translator)
    with TestClient(create_app(engine)) as client:
        assert client.post("/translate", json={"text": LINES}).json() == \
               {"translations": translator.translate(LINES)}
        response = client.post("/attention", json={"text": "A dog."})
        assert error_of(response, 501) is None
        assert "torch engine" in response.json()["error"]
        info = client.get("/info").json()
        assert (info["engine"], info["attention"], info["parameters"]) == ("other", False, None)


def test_a_failing_batch_answers_500_and_the_server_keeps_serving(translator):
    with TestClient(create_app(OtherEngine(translator))) as client:
        response = client.post("/translate", json={"text": ["boom"]})
        assert error_of(response, 500) is None
        assert "the engine failed" in response.json()["error"]
        assert client.post("/translate", json={"text": LINES[:2]}).json() == \
               {"translations": translator.translate(LINES[:2])}
        assert client.get("/health").json()["failed_batches"] == 1


# ---- limits and bad input -------------------------------------------------------------------

LONG_IN_PIECES = " ".join(["Ein Mann fährt Fahrrad."] * 30)  # < MAX_CHARS, > 63 pieces

BAD_TRANSLATE = [  # (body, status, field)
    ({"text": ["a"] * (MAX_SENTENCES + 1)}, 422, "text"),
    ({"text": []}, 422, "text"),
    ({"text": ["ok", "a" * (MAX_CHARS + 1)]}, 422, "text[1]"),
    ({"text": ["ok", LONG_IN_PIECES]}, 422, "text[1]"),
    ({"text": "a single string"}, 422, "text"),
    ({"text": ["ok", 3]}, 422, "text[1]"),
    ({"text": ["ok"], "beam_size": "5"}, 422, "beam_size"),
    ({"text": ["ok"], "beam_size": 0}, 422, "beam_size"),
    ({"text": ["ok"], "beam_size": MAX_BEAM + 1}, 422, "beam_size"),
    ({"text": ["ok"], "beam_size": 2.0}, 422, "beam_size"),
    ({"text": ["ok"], "beam_size": True}, 422, "beam_size"),
    ({"text": ["ok"], "nbest": 0}, 422, "nbest"),
    ({"text": ["ok"], "beam_size": 2, "nbest": 3}, 422, "nbest"),
    ({"text": ["ok"], "nbest": 6}, 422, "nbest"),  # the default beam is 5
    ({"beam_size": 5}, 422, "text"),
    (["ok"], 422, "body"),
    ({"text": ["ok"], "checkpoint": "/etc/passwd"}, 422, "checkpoint"),
    ({"text": ["ok"], "model": "runs/other"}, 422, "model"),
    ({"text": ["ok"], "temperature": 0}, 422, "temperature"),
    ({"text": ["ok"], "sampling_topk": -1}, 422, "sampling_topk"),
    ({"text": ["ok"], "sampling_topp": 1.5}, 422, "sampling_topp"),
    ({"text": ["ok"], "sampling_topk": 5, "beam_size": 4}, 422, "beam_size"),
    ({"text": ["ok"], "temperature": 1.0, "nbest": 2}, 422, "nbest"),
    ({"text": ["ok"], "seed": 1}, 422, "seed"),
    ({"text": ["ok", "ok"], "prefix": ["Ein"]}, 422, "prefix"),
    ({"text": ["ok"], "prefix": "Ein"}, 422, "prefix"),
    ({"text": ["ok"], "alignment": "yes"}, 422, "alignment"),
    ({"text": ["ok"], "alpha": -1.0}, 422, "alpha"),
    ({"text": ["ok"], "max_len_b": 0}, 422, "max_len_b"),
    ({"text": ["ok"], "max_len_a": "1"}, 422, "max_len_a"),
    ({"text": ["ok"], "alignment_layer": 0}, 422, "alignment_layer"),
    ({"text": ["ok"], "alignment": True, "alignment_layer": 99}, 422, "alignment_layer"),
    ({"text": ["ok"], "alignment": True, "alignment_head": 99}, 422, "alignment_head"),
    ({"text": ["ok"], "sampling_topk": 2, "seed": -1}, 422, "seed"),
]
BAD_BYTES = [  # raw bodies: (bytes, status, field)
    (b'{"text": ["ok"', 400, "body"),
    (b"", 400, "body"),
    (b'{"text": ["caf\xe9"]}', 400, "body"),  # Latin-1, not UTF-8
    (b'{"text": ["\xed\xa0\x80"]}', 400, "body"),  # a UTF-8-encoded surrogate
    (b'{"text": ["\\ud800 alone"]}', 400, "body"),  # a lone surrogate as a JSON escape
    (b'{"text": ["' + b"a" * MAX_BODY_BYTES + b'"]}', 413, "body"),
]


@pytest.mark.parametrize("body, status, field", BAD_TRANSLATE)
def test_bad_translate_requests_name_the_field(client, translator, body, status, field):
    assert error_of(client.post("/translate", json=body), status) == field
    assert client.post("/translate", json={"text": LINES[:1]}).json() == \
           {"translations": translator.translate(LINES[:1])}


@pytest.mark.parametrize("body, status, field", BAD_BYTES)
def test_bad_bytes_never_reach_the_model(client, translator, body, status, field):
    for path in ("/translate", "/attention"):
        response = client.post(path, content=body,
                               headers={"Content-Type": "application/json"})
        assert error_of(response, status) == field
    assert client.post("/translate", json={"text": LINES[:1]}).json() == \
           {"translations": translator.translate(LINES[:1])}


@pytest.mark.parametrize("body, status, field", [
    ({"text": ["A dog."]}, 422, "text"),
    ({"text": ""}, 422, "text"),
    ({"text": "   "}, 422, "text"),
    ({"text": "a" * (MAX_CHARS + 1)}, 422, "text"),
    ({"text": LONG_IN_PIECES}, 422, "text[0]"),
    ({"text": "A dog.", "beam_size": 0}, 422, "beam_size"),
    ({"text": "A dog.", "checkpoint": "x.pt"}, 422, "checkpoint"),
])
def test_bad_attention_requests_name_the_field(client, body, status, field):
    assert error_of(client.post("/attention", json=body), status) == field
    assert client.post("/attention", json={"text": "A dog."}).status_code == 200


def test_a_body_larger_than_declared_limit_is_refused_unread(client):
    response = client.post("/translate", content=b"{}",
                           headers={"Content-Length": str(MAX_BODY_BYTES + 1)})
    assert error_of(response, 413) == "body"


def test_no_request_can_reach_a_file_or_another_model(client, translator):
    paths = {route.path for route in client.app.routes}
    assert paths == {"/", "/health", "/info", "/translate", "/attention", "/static",
                     "/openapi.json"}
    for path in ("/static/../serve.py", "/static/%2e%2e/serve.py", "/static/..%2fserve.py",
                 "/static/%2fetc%2fpasswd", "/../../etc/passwd"):
        assert client.get(path).status_code == 404, path
    info = client.get("/info").json()
    assert info["model"] == translator.model.config.to_dict()


# ---- health, info, the page's files -----------------------------------------------------------

def test_health_and_info(client, translator):
    before = client.get("/health").json()
    assert before["status"] == "ok"
    client.post("/translate", json={"text": LINES[:3]})
    after = client.get("/health").json()
    assert after["batches"] == before["batches"] + 1
    assert after["sentences"] == before["sentences"] + 3
    info = client.get("/info").json()
    assert info["engine"] == "torch" and info["attention"] is True and info["models"] == 1
    assert info["parameters"] == sum(p.numel() for p in translator.model.parameters())
    assert info["decoding"] == {"beam_size": 5, "alpha": 1.0, "max_len_a": 1.5, "max_len_b": 10}
    assert info["limits"] == {"sentences": MAX_SENTENCES, "characters": MAX_CHARS,
                              "source_tokens": 63, "beam_size": MAX_BEAM,
                              "body_bytes": MAX_BODY_BYTES}
    assert info["languages"] == {"source": None, "target": None}  # no training config stored


def test_the_page_is_served_and_needs_nothing_from_outside(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert '<script src="/static/app.js">' in page.text
    for name in ("app.js", "style.css"):
        response = client.get(f"/static/{name}")
        assert response.status_code == 200 and response.text
    for name in ("index.html", "app.js", "style.css"):
        text = client.get("/" if name == "index.html" else f"/static/{name}").text
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, name


def test_openapi_documents_the_request_bodies(client):
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["required"] == ["text"]
    properties = body["schema"]["properties"]
    assert {"prefix", "alignment", "sampling_topk", "sampling_topp", "temperature",
            "seed"} < set(properties)
    assert json.dumps(properties["text"]).count("maxItems") == 1


# ---- transformer serve -----------------------------------------------------------------------

def test_script_bad_checkpoint_exits_1_with_one_line(tmp_path, capsys):
    script = serve_command
    assert script.main(["--checkpoint", str(tmp_path / "missing.pt")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "missing.pt" in err
    (tmp_path / "empty").mkdir()
    assert script.main(["--checkpoint", str(tmp_path / "empty")]) == 1
    assert "no checkpoint_best.pt" in capsys.readouterr().err


def test_the_server_loads_its_model_on_the_thread_that_runs_it(random_checkpoint,
                                                                monkeypatch):
    """`transformer serve` computes on one thread only, the model thread: loading and every
    translation (a second thread computing at several threads would make OpenMP a second
    pool of threads, `serve.model_thread`)."""
    import uvicorn

    threads = {}
    load = serve_command.load_model

    def loaded(args):
        threads["load"] = threading.current_thread()
        return load(args)

    def served(app, **options):  # instead of listening: one request through the app
        search = Translator._search

        def searched(self, *args, **kwargs):
            threads["search"] = threading.current_thread()
            return search(self, *args, **kwargs)

        monkeypatch.setattr(Translator, "_search", searched)
        with TestClient(app) as client:
            assert client.post("/translate", json={"text": LINES[:2]}).status_code == 200

    monkeypatch.setattr(serve_command, "load_model", loaded)
    monkeypatch.setattr(uvicorn, "run", served)
    assert serve_command.main(["--checkpoint", str(random_checkpoint), "--threads", "2"]) == 0
    assert threads["load"] is threads["search"] is not threading.main_thread()


def test_script_accepts_only_known_engines_and_listens_locally_by_default():
    parser = serve_command.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--checkpoint", "x.pt", "--engine", "onnx"])
    args = parser.parse_args(["--checkpoint", "x.pt"])
    assert (args.engine, args.host, args.port) == ("auto", "127.0.0.1", 8000)


def test_the_ctranslate2_engine_serves_translations_but_not_attention(random_checkpoint,
                                                                      tmp_path):
    """transformer serve --engine ctranslate2: the same API over an exported model; its
    answers are that engine's, /attention is refused (501) and /info says which engine."""
    from transformer.decoding.vocab_map import VocabMap
    from transformer.deploy.engines import load_translator
    from transformer.deploy.export import export_ctranslate2

    export_ctranslate2(Translator.load(random_checkpoint, device="cpu"), tmp_path / "ct2")
    ct2 = load_translator(tmp_path / "ct2", "ctranslate2", threads=1)
    with TestClient(create_app(ct2)) as client:
        response = client.post("/translate", json={"text": LINES, "beam_size": 2})
        assert response.json() == {"translations": ct2.translate(LINES, beam_size=2)}
        response = client.post("/attention", json={"text": "A dog."})
        assert error_of(response, 501) is None and "torch engine" in response.json()["error"]
        info = client.get("/info").json()
        assert info["engine"] == "ctranslate2" and info["attention"] is False
        assert info["model"]["num_heads"] == ct2.model_config.num_heads
        assert info["vocab_map"] is None  # exported without one
    mapped = tmp_path / "ct2-vmap"
    export_ctranslate2(Translator.load(random_checkpoint, device="cpu"), mapped,
                       vocab_map=VocabMap(["▁a"], {"▁a": ["▁b"]}, pairs=1))
    with TestClient(create_app(load_translator(mapped, "ctranslate2", threads=1))) as client:
        assert client.get("/info").json()["vocab_map"] == {
            "file": "vmap.txt", "pairs": 1, "always": 1, "source_pieces": 1}
