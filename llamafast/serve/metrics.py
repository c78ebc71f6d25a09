"""The server's Prometheus metrics (prometheus_client), in a registry of its own so that two servers in one
process (the tests) never share counts. The engine thread and the event loop both update them: prometheus_client's
metrics are thread-safe."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

# Time to first token: a few ms at 7B on an H100 for a short prompt with a warm cache, hundreds of ms for a
# long prompt or a queued request, seconds on the CPU.
TTFT_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Time between tokens: about 5 ms at 7B bf16 on an H100 (208 tok/s), 3 ms in FP8, tens of ms on the CPU.
TOKEN_BUCKETS = (0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1.0)
PREFIX = "llamafast_"


class Metrics:
    def __init__(self):
        disable_created_metrics()  # no *_created series: a scrape shows the counts only
        self.registry = r = CollectorRegistry()
        self.requests = Counter(PREFIX + "requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens of the completions run", registry=r)
        self.cached_tokens = Counter(PREFIX + "cached_prompt_tokens",
                                     "Prompt tokens served from the KV cache (prefix reuse), not run again", registry=r)
        self.generated_tokens = Counter(PREFIX + "generated_tokens", "Tokens sampled, end of sequence included",
                                        registry=r)
        self.completions = Counter(PREFIX + "completions", "Completions run on the engine, by how they ended "
                                   "(stop, length, cancelled: the client left; error)", ["finish_reason"], registry=r)
        self.dropped = Counter(PREFIX + "dropped_requests", "Queued requests whose client left before they started",
                               registry=r)
        self.queue_depth = Gauge(PREFIX + "queue_depth", "Requests waiting for the engine", registry=r)
        self.running = Gauge(PREFIX + "requests_running", "Requests decoding on the engine (0 or 1: batch 1)",
                             registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Request received to its first token, "
                              "queueing included", buckets=TTFT_BUCKETS, registry=r)
        self.token_latency = Histogram(PREFIX + "time_per_output_token_seconds", "Time between a request's tokens",
                                       buckets=TOKEN_BUCKETS, registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
