"""`llamafast serve`: an OpenAI-compatible HTTP server on one engine at batch 1, built on FastAPI, uvicorn, pydantic
and prometheus_client.

    schema.py       request bodies (pydantic), with OpenAI's field names and types
    responses.py    response bodies, stream chunks, errors and logprobs as OpenAI shapes them
    completions.py  the chat and text completion routes: JSON or server-sent events
    app.py          the FastAPI app: routes, API key, size limit, error objects
    worker.py       the engine thread and its FIFO queue
    runner.py       a request run on the engine (prefix reuse, seeds, token streaming)
    metrics.py      Prometheus metrics
    server.py       the socket, uvicorn, signals
"""

from llamafast.serve.runner import Hooks, ModelSetup
from llamafast.serve.server import DEFAULT_MAX_QUEUE, ServeOptions, is_loopback, listen, serve, url

__all__ = ["DEFAULT_MAX_QUEUE", "Hooks", "ModelSetup", "ServeOptions", "is_loopback", "listen", "serve", "url"]
