"""A translation server: a JSON API, a dynamic batcher, and a page showing every head.

    app = create_app(Translator.load("runs/x"))      # `transformer serve` runs it with uvicorn

Endpoints (errors are `{"error": "...", "field": "..."}` with a 4xx/5xx status):

- `POST /translate` `{"text": [...], "beam_size": 5, "nbest": 1}` -> `{"translations": [...]}`
  in input order; with `nbest > 1` each translation is a list of `{"text", "score"}`.
  The other fields are `transformer translate`'s options under the same names (one
  `request.DecodingRequest`): `alpha`, `max_len_a`, `max_len_b`; `sampling_topk`,
  `sampling_topp`, `temperature`, `seed` (sampling instead of beam search); `prefix` (one
  string per sentence that its translation must begin with); `constraints` (one list per
  sentence of phrases its translation must contain, `[]` for none; `ordered_constraints:
  true`: in that order; the answer adds `"constraints_met": [true, ...]`); `alignment: true`
  (`"alignments": ["0-0 1-2", ...]`, or an `"alignment"` per n-best entry), with
  `alignment_layer` and `alignment_head`; `target_lang` (`"de"`), the language to translate
  into: required by a multilingual model, one of `/info`'s `target_languages`. A bad option
  is a 422 naming its field.
- `POST /attention` `{"text": "..."}` (and `target_lang`, as above) -> the sentence's
  translation, its SentencePiece pieces (a multilingual model's target-language tag first)
  and every attention layer's per-head weights, teacher-forced on that translation (the torch
  engine only; another engine answers 501; an ensemble shows its first member's).
- `GET /health`, `GET /info` (languages, the target languages, parameters, models (an
  ensemble's members), model config, engine, decoding defaults, limits); `GET /` the page
  (`static/`: plain HTML, JS and CSS, nothing fetched from outside).

Requests arriving together are translated together: `Batcher` queues them, and one worker
takes the first waiting request plus every one waiting with it, and under load whatever
arrives within `max_wait_s`, up to `max_tokens` source tokens, translates them in one
`translate` call on the model thread, and hands each request its own slice of the results.
A lone request at an idle server is translated at once. The model runs on one thread
(`ThreadPoolExecutor` of one worker), so `/translate` batches and `/attention` never use it
at the same time.

Input is checked before anything reaches the model: the body's size, strict UTF-8, JSON,
the field types (pydantic, strict, no unknown fields: a request cannot name a file or a
checkpoint), and the limits below. The translator is fixed when the app is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from ..decoding.alignment import format_alignment
from ..decoding.request import DecodingRequest, RequestError
from ..decoding.translator import BaseTranslator, Translation, Translator
from ..errors import DataError, TransformerError
from ..tools.attention_maps import KINDS, attention_layers, attention_maps, axis_labels

__all__ = ["MAX_SENTENCES", "MAX_CHARS", "MAX_BEAM", "MAX_BODY_BYTES", "TranslateRequest",
           "AttentionRequest", "ApiError", "read_request", "source_tokens", "BatchLimits",
           "Batcher", "check_prefixes", "check_constraints", "translate_response",
           "attention_report", "server_info", "model_thread", "create_app"]

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
MAX_SENTENCES = 64  # sentences per /translate request
MAX_CHARS = 1000  # characters per sentence (the model's position limit is checked too)
MAX_BEAM = 16
MAX_PHRASES = 16  # constraint phrases per sentence
MAX_BODY_BYTES = 512 * 1024  # room for 64 x 1,000 characters, even as \uXXXX escapes


# ---- requests -------------------------------------------------------------------------------

Sentence = Annotated[str, StringConstraints(max_length=MAX_CHARS)]
BeamSize = Annotated[int, Field(le=MAX_BEAM)]  # the server's limit; the rest: DecodingRequest


class TranslateRequest(BaseModel):
    """The body of POST /translate: the sentences, their prefixes, and the decoding options
    of `transformer translate` under the same names (`request.DecodingRequest.from_options`
    checks them; only their types and the server's own limits are checked here)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    text: Annotated[list[Sentence], Field(min_length=1, max_length=MAX_SENTENCES)]
    # One per sentence: text its translation must begin with ("" for none).
    prefix: Annotated[list[Sentence], Field(min_length=1, max_length=MAX_SENTENCES)] | None = None
    # One list per sentence: phrases its translation must contain ([] for none).
    constraints: Annotated[list[Annotated[list[Sentence], Field(max_length=MAX_PHRASES)]],
                           Field(min_length=1, max_length=MAX_SENTENCES)] | None = None
    ordered_constraints: bool = False  # the phrases in their given order
    beam_size: BeamSize | None = None  # None: the translator's default
    nbest: BeamSize = 1
    alpha: float | None = None
    max_len_a: float | None = None
    max_len_b: int | None = None
    # Sampling (`request.Sampling`) instead of beam search when any of these is given.
    sampling_topk: int | None = None
    sampling_topp: float | None = None
    temperature: float | None = None
    seed: int | None = None
    alignment: bool = False  # also the word alignment of each translation ("0-0 1-2")
    alignment_layer: int | None = None
    alignment_head: int | None = None
    target_lang: str | None = None  # None: the model's only target language

    def decoding(self, translator: BaseTranslator) -> DecodingRequest:
        """The decoding request over the translator's defaults (422 naming the field)."""
        options = self.model_dump(exclude={"text", "prefix", "constraints"})
        return _checked(lambda: translator.request(
            DecodingRequest.from_options(translator.decoding, **options)))


class AttentionRequest(BaseModel):
    """The body of POST /attention: one sentence."""

    model_config = ConfigDict(strict=True, extra="forbid")
    text: Annotated[Sentence, StringConstraints(min_length=1)]
    beam_size: BeamSize | None = None
    target_lang: str | None = None

    def decoding(self, translator: BaseTranslator) -> DecodingRequest:
        """The decoding request over the translator's defaults (422 naming the field)."""
        return _checked(lambda: translator.request(beam_size=self.beam_size,
                                                   target_lang=self.target_lang))


class ApiError(TransformerError):
    """An answer other than 200: HTTP status, one-line message, the field it is about."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


RequestModel = TypeVar("RequestModel", bound=BaseModel)


def _checked(build: Callable[[], DecodingRequest]) -> DecodingRequest:
    """`build()`, its `RequestError` answered as a 422 naming the field."""
    try:
        return build()
    except RequestError as e:
        raise ApiError(422, e.message(str), e.field) from None


async def read_request(request: Request, model: type[RequestModel]) -> RequestModel:
    """The body, at most MAX_BODY_BYTES, strict UTF-8, parsed and validated as `model`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ApiError(413, f"the body has {declared} bytes; at most {MAX_BODY_BYTES}", "body")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise ApiError(413, f"the body is over {MAX_BODY_BYTES} bytes", "body")
    data = bytes(body)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not valid UTF-8 (byte {e.start})", "body") from None
    try:
        return model.model_validate_json(data)  # rejects lone surrogates (\ud800) too
    except ValidationError as e:
        error = e.errors()[0]
        name = _field_name(error["loc"])
        if error["type"] == "json_invalid":
            raise ApiError(400, f"the body is not valid JSON: {error['msg']}", "body") from None
        raise ApiError(422, f"{name}: {error['msg']}", name) from None


def _field_name(loc: Sequence[Any]) -> str:
    """pydantic's location ("text", 3) -> "text[3]"; the body itself -> "body"."""
    name = ""
    for part in loc:
        name += f"[{part}]" if isinstance(part, int) else f".{part}" if name else str(part)
    return name or "body"


def source_tokens(translator: BaseTranslator, lines: Sequence[str]) -> list[int]:
    """Source tokens (tags + pieces + EOS) of each line; a line over the model's position
    limit (`max_source_tokens` pieces: the tag and EOS take their places) is refused, naming
    it (translate.py truncates such a line with a warning instead)."""
    limit = translator.max_source_tokens
    added = translator.model_config.max_positions - limit  # EOS and a target-language tag
    counts = [len(ids) for ids in translator.tokenizers.src.encode_batch(list(lines))]
    for i, count in enumerate(counts):
        if count > limit:
            raise ApiError(422, f"text[{i}] has {count} SentencePiece pieces; the model reads "
                                f"at most {limit}", f"text[{i}]")
    return [count + added for count in counts]


# ---- the batcher ----------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchLimits:
    """How the batcher groups requests: under load it waits at most `max_wait_s` after the
    first one for others (`Batcher._gather`), takes at most `max_tokens` source tokens per
    batch (a bigger request goes alone), and keeps at most `max_queue` requests waiting
    (more get 503)."""

    max_wait_s: float = 0.005
    max_tokens: int = 2048
    max_queue: int = 1024


@dataclass
class _Job:
    lines: list[str]
    prefixes: list[str] | None
    constraints: list[list[str]] | None
    request: DecodingRequest
    tokens: int
    future: asyncio.Future = field(repr=False)

    @property
    def key(self) -> Any:
        """Jobs share a `translations` call only with the same decoding options; a sampling
        job goes alone, so that its seed gives the same draws whatever else arrives."""
        return self.request if self.request.sampling is None else id(self)


@dataclass
class BatchStats:
    """What the batcher has done, for /health and the benchmark."""

    batches: int = 0
    sentences: int = 0
    failed_batches: int = 0


class Batcher:
    """A queue of translation requests and one worker translating them in batches."""

    def __init__(self, translator: BaseTranslator, executor: ThreadPoolExecutor,
                 limits: BatchLimits = BatchLimits()):
        self.translator, self.executor, self.limits = translator, executor, limits
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(maxsize=limits.max_queue)
        self._held: deque[_Job] = deque()  # taken from the queue, left for a later batch
        self._last_batch = 0  # requests in the batch before
        self._worker: asyncio.Task | None = None

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the worker; requests still waiting get an error."""
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        while not self._queue.empty():
            self._held.append(self._queue.get_nowait())
        for job in self._held:
            _settle(job, error=ApiError(503, "the server is shutting down"))

    async def translate(self, lines: list[str], prefixes: list[str] | None,
                        request: DecodingRequest, tokens: int,
                        constraints: list[list[str]] | None = None
                        ) -> list[list[Translation]]:
        """Queue the lines (with their prefixes and constraint phrases, where given) and
        wait for their n-best lists, in input order."""
        job = _Job(lines, prefixes, constraints, request, tokens,
                   asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            raise ApiError(503, f"the server is busy ({self.limits.max_queue} requests are "
                                f"waiting); try again later") from None
        return await job.future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = await self._gather()
            try:
                results = await loop.run_in_executor(self.executor, self._translate, jobs)
            except Exception as e:  # any: one bad batch must not stop the server (each of
                # its requests gets a 500 naming the error; the next batch goes on)
                log.exception("translating a batch of %d requests failed", len(jobs))
                self.stats.failed_batches += 1
                error = ApiError(500, f"translation failed: {type(e).__name__}: {e}")
                for job in jobs:
                    _settle(job, error=error)
                continue
            for job, result in zip(jobs, results, strict=True):
                _settle(job, result=result)

    async def _gather(self) -> list[_Job]:
        """The next batch: the oldest job, then held-back and waiting jobs with the same
        options while the token budget lasts. Under load (the oldest job was already waiting
        when the worker came for it, or the batch before held several requests) it also waits
        at most `max_wait_s` for more to arrive; a lone request at an idle server goes at
        once, without that wait."""
        loaded = bool(self._held) or not self._queue.empty() or self._last_batch > 1
        first = self._held.popleft() if self._held else await self._queue.get()
        batch, tokens = [first], first.tokens
        for job in list(self._held):
            if job.key == first.key and tokens + job.tokens <= self.limits.max_tokens:
                self._held.remove(job)
                batch.append(job)
                tokens += job.tokens
        deadline = asyncio.get_running_loop().time() + (self.limits.max_wait_s if loaded else 0.0)
        while tokens < self.limits.max_tokens:
            job = await self._next_job(deadline)
            if job is None:
                break
            if job.key != first.key or tokens + job.tokens > self.limits.max_tokens:
                self._held.append(job)
                if job.key == first.key:
                    break  # the budget is spent
                continue
            batch.append(job)
            tokens += job.tokens
        self._last_batch = len(batch)
        return batch

    async def _next_job(self, deadline: float) -> _Job | None:
        """A waiting job at once, else one arriving before `deadline`, else None."""
        with contextlib.suppress(asyncio.QueueEmpty):
            return self._queue.get_nowait()
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            return None
        with contextlib.suppress(asyncio.TimeoutError):
            return await asyncio.wait_for(self._queue.get(), remaining)
        return None

    def _translate(self, jobs: list[_Job]) -> list[list[list[Translation]]]:
        """On the model thread: one `translations` call for all the jobs' lines, split
        back."""
        lines = [line for job in jobs for line in job.lines]
        prefixes = None
        if any(job.prefixes is not None for job in jobs):
            prefixes = [p for job in jobs for p in (job.prefixes or [""] * len(job.lines))]
        constraints = None
        if any(job.constraints is not None for job in jobs):
            constraints = [c for job in jobs for c in (job.constraints or [[]] * len(job.lines))]
        scored = self.translator.translations(lines, jobs[0].request, prefixes=prefixes,
                                              constraints=constraints)
        self.stats.batches += 1
        self.stats.sentences += len(lines)
        results, start = [], 0
        for job in jobs:
            results.append(scored[start:start + len(job.lines)])
            start += len(job.lines)
        return results


def _settle(job: _Job, *, result: Any = None, error: Exception | None = None) -> None:
    """Answer a job unless its request is gone (the client disconnected: cancelled)."""
    if job.future.done():
        return
    if error is not None:
        job.future.set_exception(error)
    else:
        job.future.set_result(result)


def check_prefixes(body: TranslateRequest) -> None:
    """One prefix per sentence, where prefixes are given, and one list of constraint
    phrases (422 naming the field)."""
    if body.prefix is not None and len(body.prefix) != len(body.text):
        raise ApiError(422, f"prefix: {len(body.prefix)} prefixes for {len(body.text)} "
                            f"sentences; give one per sentence (\"\" for none)", "prefix")
    if body.constraints is not None and len(body.constraints) != len(body.text):
        raise ApiError(422, f"constraints: {len(body.constraints)} lists for "
                            f"{len(body.text)} sentences; give one per sentence ([] for none)",
                       "constraints")


def check_constraints(translator: BaseTranslator, body: TranslateRequest,
                      request: DecodingRequest) -> None:
    """The request's constraint phrases, checked before it is queued
    (`BaseTranslator.encode_constraints`; 422 naming the field): a bad phrase must not fail
    the batch it would share with other requests."""
    if body.constraints is None:
        return
    sources = translator.encode_sources(body.text, request.target_lang)
    try:
        translator.encode_constraints(body.constraints, sources, request)
    except RequestError as e:
        raise ApiError(422, e.message(str), e.field) from None
    except DataError as e:
        raise ApiError(422, f"constraints: {e}", "constraints") from None


def translate_response(results: list[list[Translation]], request: DecodingRequest,
                       constrained: bool = False) -> dict[str, Any]:
    """The body answering /translate: translations (strings, or n-best lists of text and
    score), with alignments their word alignments in the same shape, and for a request
    with constraints whether each sentence's best translation contains them all."""
    aligned = request.alignment is not None
    if request.nbest == 1:
        answer: dict[str, Any] = {"translations": [hyps[0].text for hyps in results]}
        if aligned:
            answer["alignments"] = [format_alignment(hyps[0].alignment) for hyps in results]
    else:
        answer = {"translations": [[_scored(t, aligned) for t in hyps] for hyps in results]}
    if constrained:
        answer["constraints_met"] = [hyps[0].constraints_met for hyps in results]
    return answer


def _scored(translation: Translation, alignment: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"text": translation.text, "score": translation.score}
    if alignment:
        entry["alignment"] = format_alignment(translation.alignment)
    return entry


# ---- attention and info ---------------------------------------------------------------------

def attention_report(translator: Translator, text: str,
                     request: DecodingRequest | None = None) -> dict[str, Any]:
    """Translate `text`, then every attention layer's weights teacher-forced on that
    translation (`attention_maps.attention_maps`): per layer its kind, block index, the
    original indices of its remaining heads (pruned heads are absent) and the weights,
    (heads, queries, keys) as nested lists. `labels[kind]` names the queries and keys with
    SentencePiece pieces (`attention_maps.axis_labels`); the source's are those the model
    reads (`encode_sources`: a multilingual model's tag first). An ensemble shows its first
    member's attention (`Translator.aligner`)."""
    translation = translator.translate([text], request)[0]
    tokenizers = translator.tokenizers
    target_lang = None if request is None else request.target_lang
    src_ids = translator.encode_sources([text], target_lang)[0][:-1]  # attention_maps adds EOS
    tgt_ids = tokenizers.tgt.encode(translation)
    model = translator.aligner
    maps = attention_maps(model, src_ids, tgt_ids)  # name -> (heads, q, k)
    labels = axis_labels(tokenizers, src_ids, tgt_ids)
    return {
        "text": text, "translation": translation, "num_heads": model.config.num_heads,
        "kinds": KINDS,
        "labels": {kind: {"queries": q, "keys": k} for kind, (q, k) in labels.items()},
        "layers": [{"name": layer.name, "kind": layer.kind, "layer": layer.layer,
                    "heads": layer.module.head_ids,
                    "weights": maps[layer.name].double().round(decimals=5).tolist()}
                   for layer in attention_layers(model)],
    }


def server_info(translator: BaseTranslator) -> dict[str, Any]:
    """What /info reports: engine, languages (a multilingual model's target is null), the
    target languages `target_lang` may name, model size, how many models decode (an
    ensemble's members) and the config (an ensemble's first member's), decoding defaults
    and the request limits. Fields an engine cannot tell are null."""
    languages = translator.languages
    return {
        "engine": translator.engine,
        "languages": {"source": languages["src"], "target": languages["tgt"]},
        "target_languages": list(translator.target_languages),
        "parameters": translator.num_parameters,  # an ensemble's: its members', summed
        "models": translator.num_models,  # an ensemble's members, else 1
        "model": translator.model_config.to_dict(),
        "decoding": asdict(translator.decoding),
        "attention": isinstance(translator, Translator),
        # an export's vocabulary map: outputs then depend on the requests batched together
        "vocab_map": translator.vocab_map,
        "limits": {"sentences": MAX_SENTENCES, "characters": MAX_CHARS,
                   "source_tokens": translator.max_source_tokens,
                   "beam_size": MAX_BEAM, "body_bytes": MAX_BODY_BYTES},
    }


# ---- the app --------------------------------------------------------------------------------

def model_thread() -> ThreadPoolExecutor:
    """The thread the model computes on: every search and attention report. A translator
    loaded on it too (`transformer serve`) leaves the process one pool of OpenMP threads:
    with a second one, made by computing on the main thread at more than one thread, the
    OpenMP threads outnumber the cores and sleep between operators, and each operator then
    waits to wake them (a lone sentence 2x slower at 2 threads on 2 cores)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")


def create_app(translator: BaseTranslator, batching: BatchLimits = BatchLimits(),
               executor: ThreadPoolExecutor | None = None) -> FastAPI:
    """The FastAPI app serving `translator` (fixed for the app's life) on the model thread,
    `executor` (one worker; by default a new one), shut down with the app. The batcher's
    worker runs between the app's startup and shutdown (`with TestClient(app)` in tests)."""
    executor = executor or model_thread()
    state: dict[str, Batcher] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["batcher"] = Batcher(translator, executor, batching)
        state["batcher"].start()
        try:
            yield
        finally:
            await state["batcher"].stop()
            executor.shutdown(wait=True)

    app = FastAPI(title="transformer", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse({"error": error.message, "field": error.field}, error.status)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse({"error": f"internal error: {type(error).__name__}",
                             "field": None}, 500)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", **asdict(state["batcher"].stats)}

    @app.get("/info")
    async def info() -> dict[str, Any]:
        return server_info(translator)

    @app.post("/translate", openapi_extra=_body_schema(TranslateRequest))
    async def translate(request: Request) -> dict[str, Any]:
        body = await read_request(request, TranslateRequest)
        decoding = body.decoding(translator)
        check_prefixes(body)
        check_constraints(translator, body, decoding)
        tokens = sum(source_tokens(translator, body.text))
        results = await state["batcher"].translate(body.text, body.prefix, decoding, tokens,
                                                   body.constraints)
        return translate_response(results, decoding, body.constraints is not None)

    @app.post("/attention", openapi_extra=_body_schema(AttentionRequest))
    async def attention(request: Request) -> dict[str, Any]:
        if not isinstance(translator, Translator):
            raise ApiError(501, f"attention weights need the torch engine; this server runs "
                                f"{translator.engine}")
        body = await read_request(request, AttentionRequest)
        if not body.text.strip():
            raise ApiError(422, "text: the sentence is blank", "text")
        decoding = body.decoding(translator)
        source_tokens(translator, [body.text])
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, attention_report, translator, body.text,
                                          decoding)

    return app


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI's description of a body the endpoint reads itself (`read_request`)."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": model.model_json_schema()}}}}
