"""`GET /metrics`: the server's counters in Prometheus' text format (prometheus-client).

Requests by route and status, tokens in and out, the queue, time to the first token and per
output token, the decode's steps and the tokens each draft source got accepted (MAT is
`tr_step_tokens_total / tr_decode_steps_total`: the one definition core/events.py gives), the
matrix and recycled store sizes, and saves by outcome. One registry per server (not the
process-wide default), written from the decode worker's thread and the HTTP loop (the client's
metric types are thread-safe) and read on a scrape.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..core.events import GenerationStats

CONTENT_TYPE = CONTENT_TYPE_LATEST
# The routes counted by name; any other path is "other", so that a scanner's requests cannot
# grow the number of series without bound.
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
_FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_PER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


def route_label(path: str) -> str:
    if path.startswith("/v1/models/"):
        return "/v1/models"
    return path if path in ROUTES else "other"


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tr_requests", "HTTP requests answered, by route and status.", ["route", "status"], registry=r
        )
        self.prompt_tokens = Counter("tr_prompt_tokens", "Prompt tokens of decoded requests.", registry=r)
        self.reused_prompt_tokens = Counter(
            "tr_prompt_tokens_reused", "Prompt tokens whose keys and values came from the KV cache.", registry=r
        )
        self.generated_tokens = Counter("tr_generated_tokens", "Tokens generated.", registry=r)
        self.decode_steps = Counter(
            "tr_decode_steps", "Verification forward passes (the prefill not counted).", registry=r
        )
        self.step_tokens = Counter(
            "tr_step_tokens", "Tokens those steps emitted (accepted drafts + bonus).", registry=r
        )
        self.accepted = Counter(
            "tr_accepted_draft_tokens", "Emitted draft tokens, by the source that drafted them.", ["source"], registry=r
        )
        self.first_token = Histogram(
            "tr_time_to_first_token_seconds",
            "From a request joining the queue to its first generated token.",
            buckets=_FIRST_TOKEN_BUCKETS,
            registry=r,
        )
        self.per_token = Histogram(
            "tr_time_per_output_token_seconds",
            "Per request: decoding time after the first token over the tokens after it.",
            buckets=_PER_TOKEN_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("tr_queue_depth", "Requests waiting for the decoder.", registry=r)
        self.decoding = Gauge("tr_decoding", "1 while a request is being decoded.", registry=r)
        self.matrix_rows = Gauge("tr_matrix_rows_filled", "Rows of the matrix holding candidates.", registry=r)
        self.store_tokens = Gauge("tr_recycled_store_tokens", "Tokens in the recycled store.", registry=r)
        self.store_conversations = Gauge(
            "tr_recycled_store_conversations", "Conversations in the recycled store.", registry=r
        )
        self.decodes = Counter(
            "tr_decodes",
            "Decodes by outcome: finished, stopped (the client left or the server is stopping), failed.",
            ["outcome"],
            registry=r,
        )
        self.saves = Counter("tr_saves", "Saves of the matrix and store, by outcome.", ["outcome"], registry=r)

    def watch_queue(self, queued: Callable[[], int], busy: Callable[[], bool]) -> None:
        """Read the queue's depth and whether a decode runs at each scrape."""
        self.queue_depth.set_function(lambda: float(queued()))
        self.decoding.set_function(lambda: float(busy()))

    def request(self, path: str, status: int) -> None:
        self.requests.labels(route=route_label(path), status=str(status)).inc()

    def first_token_after(self, seconds: float) -> None:
        self.first_token.observe(seconds)

    def decoded(self, stats: GenerationStats, reused: int, accepted_by_source: dict[str, int]) -> None:
        """A decode ended (finished or cut): what it read, generated and accepted."""
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.reused_prompt_tokens.inc(reused)
        self.generated_tokens.inc(stats.new_tokens)
        self.decode_steps.inc(stats.steps)
        self.step_tokens.inc(stats.step_tokens)
        for source, count in accepted_by_source.items():
            self.accepted.labels(source=source).inc(count)
        if stats.new_tokens > 1:
            decoding = max(stats.wall_seconds - stats.prefill_seconds, 0.0)
            self.per_token.observe(decoding / (stats.new_tokens - 1))

    def sizes(self, matrix_rows: int, store_tokens: int | None, store_conversations: int | None) -> None:
        self.matrix_rows.set(matrix_rows)
        if store_tokens is not None:
            self.store_tokens.set(store_tokens)
            self.store_conversations.set(store_conversations or 0)

    def saved(self, ok: bool) -> None:
        self.saves.labels(outcome="ok" if ok else "failed").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
