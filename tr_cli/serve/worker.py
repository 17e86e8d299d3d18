"""One decoder, one request at a time: a loop that takes jobs in arrival order from a bounded
queue, decodes each with the decoder's step events, and hands text back to the request's event
loop as it comes.

`tr serve` runs this loop on the main thread and the HTTP event loop beside it: torch's OpenMP
threads belong to the thread that first ran the model (loading, calibration), and decoding from
another thread measured 16 % slower here (13.3 vs 15.9 tok/s, SmolLM2 fp32, 2 cores), which the
planner then answers with smaller trees. `start()` runs it on a thread of its own instead (tests).

KV reuse: the decoder keeps the last conversation's tokens and cache. A job whose prompt starts
with tokens the decoder holds (a chat client resends the whole history every turn) rewinds to the
longest shared prefix and prefills only the rest; an unrelated prompt starts over, and the old
conversation joins the recycled store. Only this thread touches the decoder and the matrix, so
periodic saves run here too, between jobs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core import StopCondition, TokenRecyclingDecoder
from ..core.constraint import ConstraintError, TokenConstraint
from ..core.errors import PrefillStopped
from ..core.events import GenerationResult, GenerationStats, track
from ..core.sampling_config import SamplingConfig
from ..text.reply_text import ReplyText
from ..text.token_pieces import TokenPieces
from ..text.tools import ToolCall
from .draft_steps import step_object
from .errors import ApiError, server_error, unavailable
from .logprobs import LogprobStream, ShownLogprob

if TYPE_CHECKING:
    from .metrics import ServerMetrics

log = logging.getLogger("tr.serve")

# How the decoder's reasons read in the API: a stop string and EOS are both "stop".
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "length": "length"}
_POLL_SECONDS = 0.2  # how often an idle worker looks at saves and shutdown


@dataclass(frozen=True)
class Delta:
    text: str
    generated: int  # tokens generated so far (the text may hold some back for stop strings)
    logprobs: tuple[ShownLogprob, ...] | None = None  # of the tokens this text shows first, when asked
    step: dict | None = None  # the step that produced it, when asked (draft_steps.step_object)


@dataclass(frozen=True)
class Finished:
    text: str
    finish_reason: str  # "stop" or "length"
    result: GenerationResult
    reused: int  # prompt tokens whose keys and values came from the cache
    queue_seconds: float
    logprobs: tuple[ShownLogprob, ...] | None = None  # of the reply's tokens, when asked
    # The tokens the client got (usage.completion_tokens): not the end-of-turn token, nor those
    # past a stop string; None: all the decoder generated.
    completion_tokens: int | None = None

    @property
    def stats(self) -> GenerationStats:
        return self.result.stats


@dataclass(frozen=True)
class Failed:
    error: ApiError


Item = Delta | Finished | Failed


@dataclass
class Job:
    """A decode to run: the whole prompt's tokens (the worker finds what the cache holds)."""

    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingConfig
    stops: tuple[str, ...] = ()
    logprobs: int | None = None  # the most likely tokens to give beside each token's; None: no logprobs
    constraint: TokenConstraint | None = None  # the grammar the reply must match (structured output)
    # With tools offered: reads the finished reply (whole: True; cut by max_tokens: False) as
    # (content, tool calls) (text/tools.py).
    read_calls: Callable[[str, bool], tuple[str | None, list[ToolCall]]] | None = None
    steps: bool = False  # a Delta per step, each with its draft step (`"tr": {"steps": true}`)
    enqueued: float = field(default_factory=time.perf_counter)
    loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)  # the requester's (default: running)
    _inbox: asyncio.Queue | None = None
    _cancel: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        self._inbox = asyncio.Queue()

    def cancel(self) -> None:
        """The client is gone: stop between two steps (or skip the job if it still waits)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def emit(self, item: Item) -> None:
        """From the worker thread: hand an item to the request's event loop."""
        try:
            self.loop.call_soon_threadsafe(self._inbox.put_nowait, item)
        except RuntimeError:  # the loop is closed (shutdown): nobody listens any more
            pass

    async def next(self, timeout: float) -> Item | None:
        """The next item, or None when `timeout` seconds pass without one."""
        try:
            return await asyncio.wait_for(self._inbox.get(), timeout)
        except asyncio.TimeoutError:
            return None


class QueueFull(Exception):
    def __init__(self, retry_after: int) -> None:
        super().__init__("queue full")
        self.retry_after = retry_after


def retry_after_seconds(recent: Sequence[float], running_for: float | None) -> int:
    """Whole seconds until a full queue likely has room: the rest of the running job, judged by
    the median of the `recent` jobs' durations (without any yet: as long again as it has run).
    A slot frees when the running job ends and the first waiting one starts."""
    if running_for is None:
        return 1  # nothing runs (the worker is starting or stopping): ask again soon
    typical = statistics.median(recent) if recent else 2 * running_for
    return max(1, math.ceil(typical - running_for))


class DecodeWorker:
    """The thread that owns the decoder. `save(end_conversation)` writes the hot state back; it
    runs every `save_every` seconds after a job, and at close."""

    def __init__(
        self,
        decoder: TokenRecyclingDecoder,
        tokenizer,
        eos_token_ids: list[int],
        queue_size: int = 8,
        save: Callable[[bool], None] | None = None,
        save_every: float = 300.0,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.pieces = TokenPieces(tokenizer)  # log-probabilities' token names, on this thread
        self.eos_token_ids = list(eos_token_ids)
        self._queue: queue.Queue[Job] = queue.Queue(maxsize=queue_size)
        self._save = save
        self.save_every = save_every
        self._last_save = time.monotonic()
        self._unsaved = False
        self._closing = threading.Event()
        self._durations: deque[float] = deque(maxlen=16)  # of recent jobs, for Retry-After
        self._running_since = 0.0
        self.running: Job | None = None
        self.jobs_done = 0
        self._thread = threading.Thread(target=self._run, name="tr-decode", daemon=True)
        self.metrics = metrics
        if metrics is not None:
            metrics.watch_queue(lambda: self.queued, lambda: self.busy)
            self._record_sizes()

    def start(self) -> None:
        """Decode on a thread of its own."""
        self._thread.start()

    def run(self) -> None:
        """Decode on the calling thread until `stop_accepting` or `close`."""
        self._run()

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    @property
    def busy(self) -> bool:
        return self.running is not None

    def submit(self, job: Job) -> None:
        """Queue a job; QueueFull (with seconds to wait) when the queue is at its bound, an
        unavailable error when the server is shutting down."""
        if self._closing.is_set():
            raise unavailable("the server is shutting down")
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            running_for = time.perf_counter() - self._running_since if self.running is not None else None
            raise QueueFull(retry_after_seconds(list(self._durations), running_for)) from None

    def stop_accepting(self) -> None:
        """A signal arrived: refuse new jobs and the queued ones (503); the running one stops
        between two steps and `run` returns. Safe to call from any thread and a signal handler."""
        self._closing.set()
        self._fail_queued()

    def close(self, timeout: float | None = None) -> None:
        """Shut down: the running job stops between two steps, queued ones are refused (503),
        then the hot state is saved (the conversation joins the store)."""
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._fail_queued()
        if self._thread.is_alive():  # inside one long forward (a prefill): its state is not ours
            log.warning("the running decode did not stop within %s s: the matrix is not saved", timeout)
            return
        self._save_now(True)

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                job = self._queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                self._save_if_due()
                continue
            if job.cancelled:
                continue
            self._running_since = time.perf_counter()
            self.running = job
            try:
                self._serve(job)
            finally:
                self.running = None
            self._save_if_due()

    def _fail_queued(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            job.emit(Failed(unavailable("the server is shutting down")))

    def _save_if_due(self) -> None:
        if not self._unsaved or time.monotonic() - self._last_save < self.save_every:
            return
        self._save_now(False)  # the conversation goes on: the next request may extend it
        self._last_save = time.monotonic()
        self._unsaved = False

    def _save_now(self, end_conversation: bool) -> None:
        """A failed save is logged; the server goes on (the state stays in memory)."""
        if self._save is None:
            return
        try:
            self._save(end_conversation)
        except Exception:  # noqa: BLE001 - never fatal: the next save may work
            log.exception("saving the matrix failed")
            saved = False
        else:
            saved = True
        if self.metrics is not None:
            self.metrics.saved(saved)
            self._record_sizes()

    def _outcome(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.decodes.labels(outcome=outcome).inc()

    def _count(self, result: GenerationResult, reused: int, accepted: dict[str, int]) -> None:
        """A decode's numbers into the metrics; a failure there is logged, never the request's."""
        if self.metrics is None:
            return
        try:
            self.metrics.decoded(result.stats, reused, accepted)
            self._record_sizes()
        except Exception:  # noqa: BLE001 - the reply is already decoded
            log.exception("recording the metrics failed")

    def _record_sizes(self) -> None:
        """The matrix's filled rows and the recycled store's size, for the metrics (read on this
        thread, which alone writes them)."""
        from ..core.drafters.store_lookup import StoreLookupDrafter
        from ..core.matrix import rows_filled

        store = next((d.store for d in self.decoder.drafters if isinstance(d, StoreLookupDrafter)), None)
        self.metrics.sizes(
            rows_filled(self.decoder.matrix),
            store.total_tokens if store is not None else None,
            len(store.documents) if store is not None else None,
        )

    def _reuse(self, prompt: list[int]) -> int:
        """Make the decoder hold the longest prefix of `prompt` it can; return how many prompt
        tokens need no prefill (the cache holds all but the last kept one, which is pending)."""
        shared = self.decoder.shared_prefix(prompt)
        if shared == 0:
            self.decoder.reset()
            return 0
        self.decoder.rewind(shared)
        return shared - 1

    def _serve(self, job: Job) -> None:
        queue_seconds = self._running_since - job.enqueued
        try:
            reused = self._reuse(job.prompt)
            self.decoder.set_sampling(job.sampling)
            self.decoder.set_logprobs(job.logprobs)
            self.decoder.set_constraint(job.constraint)
            finish = self._decode(job, reused, queue_seconds)
        except ConstraintError as exc:  # the grammar engine gave up mid-reply: the server's failure
            log.warning("the grammar stopped the decode: %s", exc)
            self.decoder.reset()  # stopped inside a step: its state is unknown
            finish = Failed(server_error(f"the reply's grammar could not go on: {exc}"))
            self._outcome("failed")
            job.emit(finish)
            return
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the server down
            log.exception("decoding failed")
            self.decoder.reset()  # its state is unknown now
            finish = Failed(server_error(f"decoding failed: {exc}"))
            self._outcome("failed")
            job.emit(finish)
            return
        finally:
            self.decoder.set_constraint(None)
            self._unsaved = True
            self.jobs_done += 1
            self._durations.append(time.perf_counter() - self._running_since)
        self._outcome("finished" if isinstance(finish, Finished) else "stopped")
        job.emit(finish)

    def _stop_requested(self, job: Job) -> Callable[[], bool]:
        """Whether the decode should stop: its client went away or the server is shutting down."""
        return lambda: job.cancelled or self._closing.is_set()

    def _why(self) -> str:
        return "the server is shutting down" if self._closing.is_set() else "the client went away"

    def _decode(self, job: Job, reused: int, queue_seconds: float) -> Item:
        feed = job.prompt[len(self.decoder.tokens) :]
        stop = StopCondition.build(
            job.max_new_tokens,
            self.eos_token_ids,
            job.stops,
            decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
        )
        reply = ReplyText(self.tokenizer, job.stops)
        result = GenerationResult(stats=GenerationStats(prompt_tokens=len(job.prompt)))
        reason = None
        stop_requested = self._stop_requested(job)
        steps = self.decoder.steps(feed, stop, stop_requested)
        accepted: dict[str, int] = {}
        logprobs = LogprobStream(reply, self.pieces) if job.logprobs is not None else None
        try:
            for event in track(steps, result):
                if self.metrics is not None:
                    if event.step == 0:
                        self.metrics.first_token_after(time.perf_counter() - job.enqueued)
                    for source, count in event.accepted_by_source.items():
                        accepted[source] = accepted.get(source, 0) + count
                delta = reply.push(event.new_tokens)
                if logprobs is not None:
                    logprobs.add(event.logprobs)
                step = step_object(event, result.stats, self.pieces) if job.steps else None
                if delta or step is not None:
                    shown = logprobs.shown() if logprobs and delta else None
                    job.emit(Delta(delta, len(result.tokens), shown, step))
                reason = event.finish_reason
                if reason is None and reply.stopped:
                    reason = "stop_string"  # a stop string longer than the decoder's look-back
                if reason is not None:
                    break
                if stop_requested():
                    break  # between two steps: the decoder's state stays consistent
        except PrefillStopped as stopped:
            read = f"{stopped.read} of {stopped.total}"
            log.info("cut while reading the prompt (%s tokens read): %s", read, self._why())
            return Failed(unavailable(f"generation stopped: {self._why()}"))
        finally:
            steps.close()
            self._count(result, reused, accepted)
        if reason is None:
            log.info("cut after %d tokens: %s", len(result.tokens), self._why())
            return Failed(unavailable(f"generation stopped: {self._why()}"))
        rest = reply.finish()
        if rest:
            job.emit(Delta(rest, len(result.tokens), logprobs.shown() if logprobs else None))
        every = None if logprobs is None else logprobs.all_shown()
        shown = reply.tokens_shown()
        return Finished(reply.text(), FINISH_REASONS[reason], result, reused, queue_seconds, every, shown)
