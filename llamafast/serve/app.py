"""The FastAPI application: the routes, the API key, the request size limit, and errors as OpenAI's error objects.

    GET  /health               200 once the model is ready, 503 while it loads (no key needed)
    GET  /v1/models            the served model
    POST /v1/chat/completions  chat (completions.py)
    POST /v1/completions       text completion (completions.py)
    POST /tokenize             llama-server's: {"content", "add_special", "with_pieces"} -> {"tokens"}
    POST /detokenize           llama-server's: {"tokens"} -> {"content"}
    GET  /metrics              Prometheus (metrics.py)
"""

from __future__ import annotations

import hmac
import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from llamafast.serve.completions import Served, chat_completion, text_completion
from llamafast.serve.metrics import Metrics
from llamafast.serve.responses import ApiError, error_body
from llamafast.serve.schema import ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from llamafast.serve.worker import Worker

# The largest request body read: a 128K-token conversation is some 512 KB of text, a few MB as JSON with its
# token ids; 16 MiB leaves room for that and still bounds what a client can make the server hold.
MAX_BODY_BYTES = 16 << 20
OPEN_PATHS = ("/health",)  # answered without the API key: load balancers and start-up scripts poll it
ROUTES = ("/health", "/v1/models", "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/metrics")
log = logging.getLogger("llamafast.serve")


def create_app(served: Served, worker: Worker, metrics: Metrics, max_body: int = MAX_BODY_BYTES) -> FastAPI:
    """The app over worker's engine thread (which the server starts and stops: server.py)."""
    app = FastAPI(title="llamafast", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, served=served, metrics=metrics, max_body=max_body)
    _handlers(app, max_body)
    created = int(time.time())

    @app.get("/health")
    async def health():
        if worker.state == "ready":
            return {"status": "ok"}
        raise ApiError("the model is loading", 503, kind="unavailable_error", headers={"Retry-After": "1"})

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model(served, created)]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        served.check_model(name)
        return _model(served, created)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        return await chat_completion(body, request, served, worker)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await text_completion(body, request, served, worker)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        ids = served.tokenizer.encode(body.content, bos=body.add_special)
        if not body.with_pieces:
            return {"tokens": ids}
        return {"tokens": [{"id": t, "piece": served.texts.piece(b, t)} for b, t in zip([None, *ids], ids)]}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        bad = [t for t in body.tokens if not 0 <= t < served.tokenizer.vocab_size]
        if bad:
            raise ApiError(f"token {bad[0]} is outside the vocabulary of {served.tokenizer.vocab_size}",
                           param="tokens")
        return {"content": served.tokenizer.decode(body.tokens)}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def _model(served: Served, created: int) -> dict:
    return {"id": served.model_id, "object": "model", "created": created, "owned_by": "llamafast",
            "context_length": served.context}


def _handlers(app: FastAPI, max_body: int) -> None:
    """Every refusal as OpenAI's error object: a 400 for a body that does not parse or has a wrong type (OpenAI
    answers 400 where FastAPI would say 422), a 404 for an unknown path, 413 past the size limit."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return JSONResponse(e.body(), e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        errors = e.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            message = f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'malformed')})"
            loc = []
        elif loc == [] and "json" not in request.headers.get("content-type", ""):
            message = "the request body must be a JSON object, sent with Content-Type: application/json"
        elif first.get("type") == "missing":
            message = f"missing required parameter: {'.'.join(loc)}"
        else:
            message = f"{'.'.join(loc) or 'body'}: {first.get('msg')}"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return JSONResponse(error_body(message + more, param=".".join(loc) or None), 400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        messages = {404: f"Unknown request URL: {request.method} {request.url.path}",
                    405: f"{request.method} is not allowed on {request.url.path}",
                    413: f"the request body is larger than the server reads ({max_body} bytes)"}
        message = messages.get(e.status_code, str(e.detail))
        return JSONResponse(error_body(message), e.status_code, headers=getattr(e, "headers", None))


class Guard:
    """The outermost ASGI layer: checks the API key (every path but /health), limits the request body (by its
    Content-Length, and by the bytes read, for a body sent in chunks), counts each response by endpoint and status,
    and answers an unexpected failure with a 500 and one log line, never a traceback. (FastAPI's own body limit
    answers in plain text, past any handler.)"""

    def __init__(self, app, served: Served, metrics: Metrics, max_body: int):
        self.app, self.served, self.metrics, self.max_body = app, served, metrics, max_body
        self.key = served.api_key.encode() if served.api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = path if path in ROUTES else "/v1/models/{id}" if path.startswith("/v1/models/") else "other"
        status = {}

        async def counted(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        if self.key is not None and path not in OPEN_PATHS and not self._authorized(scope):
            body = error_body("Incorrect API key provided: give it as Authorization: Bearer KEY",
                              "invalid_request_error", code="invalid_api_key")
            return await JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, counted)
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.max_body:
            body = error_body(f"the request body is {int(length)} bytes; the server reads at most {self.max_body}")
            return await JSONResponse(body, 413)(scope, receive, counted)
        read = 0

        async def limited():
            nonlocal read
            message = await receive()
            read += len(message.get("body", b""))
            if read > self.max_body:  # an HTTPException: FastAPI passes it on to its handler, http_error
                raise HTTPException(413)
            return message

        try:
            await self.app(scope, limited, counted)
        except Exception as e:  # noqa: BLE001 (a bug must not print a traceback or stop the server)
            log.error("%s %s failed: %s: %s", scope.get("method"), path, type(e).__name__, " ".join(str(e).split()))
            if "code" not in status:
                await JSONResponse(error_body("internal server error", "server_error"), 500)(scope, receive, counted)

    def _authorized(self, scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
