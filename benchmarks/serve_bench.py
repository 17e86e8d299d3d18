"""Client-side benchmark of `tr serve`: Token Recycling against plain decoding, as an API client sees them.

    python benchmarks/serve_bench.py                                  # 20 Spec-Bench prompts, bf16, seeded
    python benchmarks/serve_bench.py --limit 40 --max-tokens 256 --matrix-state cold --json out.json

What it does
------------
Two `tr serve` processes are started from this venv on the same model and dtype:

  A  Token Recycling with its defaults (`--tree auto`);
  B  `--tree none --lookup 0`: one token per step on the same forward, i.e. plain greedy decoding.

Each gets `--port 0`, `--no-save`, a fresh TR_HOME in a temp dir (its `cache` folder is a link to the
caller's real tr cache, so converted checkpoints are shared and nothing is converted twice) and
HF_HUB_OFFLINE=1. With `--matrix-state seeded` (the default) A starts from the starter matrix shipped
for the packaged model, as a new user would; with `cold` both get `--cold` (an empty matrix). A's
matrix keeps learning from every request during the run (nothing is saved), so later prompts are
decoded with what the earlier ones taught it, as on a real server.

After one warm-up request per server (not counted), every prompt (first turn, or `--turns 2`, picked
round-robin over the categories of the JSONL file, so all are represented) is sent to both servers
in turn, alternating which goes first, as a streamed chat completion through the official `openai`
SDK: greedy (temperature 0), `max_tokens`, `stream_options={"include_usage": True}`.

How to read it
--------------
Measured by the client, per request:
  TTFT              time from sending the request to the first streamed content;
  client tok/s      completion tokens (from the usage chunk) / total request time, TTFT included:
                    what a user waiting for the whole answer gets;
  decode tok/s      (completion tokens - 1) / (total - TTFT): the streaming rate once text flows
                    (slightly low when the first chunk already carries several tokens);
  server overhead   TTFT - tr.prefill_seconds - tr.queue_seconds: HTTP, chat template,
                    tokenisation and whatever else the server does before the first token is out.
From the server's `tr` extension (last streamed chunk): MAT (mean accepted tokens per verification
forward; 1.0 for B by construction), steps, server-side tokens/s, prefill, KV reuse.

The speedup A/B is given two ways: summed tokens over summed time (A's aggregate rate over B's),
and the median of the per-prompt ratios (robust to a few long or lucky prompts). The "identical"
count compares A's and B's texts: under float32 greedy decoding they should match exactly; under
bfloat16 a verification forward over a tree can round differently from a one-token forward, so a
few differences are expected and are reported, never treated as a failure.

Timings are wall-clock on a shared machine: run nothing else heavy meanwhile, and prefer more
prompts over more decimals. The header records CPU count and date; `--json PATH` keeps every raw
per-request record and the summary.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_PROMPTS = REPO / "benchmarks" / "prompts" / "spec_bench.jsonl"
LISTENING = re.compile(r"tr serve: listening on (http://([^\s/:]+):(\d+)/v1)\b")
WARMUP_PROMPT = "Name three colours of the rainbow."
TR_FIELDS = (
    "steps",
    "mean_accepted_tokens",
    "tokens_per_second",
    "prompt_tokens_reused",
    "prefill_tokens",
    "prefill_seconds",
    "decode_seconds",
    "queue_seconds",
)
TAIL_LINES = 40


class ServerDied(RuntimeError):
    """A server exited (or never became ready) while the benchmark needed it."""


def real_cache_dir() -> Path:
    """The caller's tr cache (converted checkpoints): $TR_HOME/cache, else the platform cache dir."""
    home = os.environ.get("TR_HOME")
    if home:
        return Path(home).expanduser() / "cache"
    try:
        import platformdirs
    except ImportError:
        return Path.home() / ".cache" / "tr"
    return Path(platformdirs.user_cache_dir("tr"))


def load_prompts(path: Path, limit: int, turns_wanted: int = 1) -> list[dict[str, Any]]:
    """`limit` records with at least `turns_wanted` turns, round-robin over categories in order of first
    appearance."""
    by_category: dict[str, list[dict[str, Any]]] = {}
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            turns = record.get("turns") or []
            if not turns or not isinstance(turns[0], str):
                raise ValueError(f"{path}:{line_number}: no first turn")
            if len(turns) < turns_wanted:
                continue
            by_category.setdefault(str(record.get("category", "")), []).append(
                {
                    "question_id": record.get("question_id", line_number),
                    "category": record.get("category"),
                    "prompt": turns[0],
                    "turns": [t for t in turns if isinstance(t, str)],
                }
            )
    picked: list[dict[str, Any]] = []
    depth = 0
    while len(picked) < limit and any(depth < len(items) for items in by_category.values()):
        for items in by_category.values():
            if depth < len(items) and len(picked) < limit:
                picked.append(items[depth])
        depth += 1
    return picked


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last lines of a log file (empty if it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class Server:
    """One `tr serve` subprocess with its own TR_HOME."""

    key: str
    label: str
    command: list[str]
    home: Path
    process: subprocess.Popen[bytes] | None = None
    base_url: str | None = None
    exit_code: int | None = None
    stderr_path: Path = field(init=False)
    stdout_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.stderr_path = self.home / "stderr.log"
        self.stdout_path = self.home / "stdout.log"

    def start(self, cache: Path) -> None:
        """Launch the process: fresh TR_HOME whose `cache` links to the shared cache, offline hub."""
        cache.mkdir(parents=True, exist_ok=True)
        (self.home / "cache").symlink_to(cache, target_is_directory=True)
        env = dict(os.environ, TR_HOME=str(self.home), HF_HUB_OFFLINE="1")
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            # Own session: a Ctrl-C in the terminal reaches only this script, which then stops the
            # servers itself with one SIGINT each. SIGINT is reset to its default in the child, as
            # a shell's background job (nohup, `cmd &`) would otherwise pass it on ignored.
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,
                preexec_fn=_default_sigint,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.process.poll() if self.process else None
            raise ServerDied(f"server {self.key} ({self.label}) exited with code {code}")

    def poll_ready(self) -> bool:
        """Whether the listening line has appeared (and /health answers 200); raises if it died."""
        if self.base_url is None:
            match = LISTENING.search(self.stderr_path.read_text(encoding="utf-8", errors="replace"))
            if match is None:
                self.check_alive()
                return False
            self.base_url = match.group(1)
        self.check_alive()
        health = self.base_url[: -len("/v1")] + "/health"
        try:
            with urllib.request.urlopen(health, timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float) -> int | None:
        """SIGINT, then wait; escalate to SIGTERM and SIGKILL only if it does not exit in time."""
        process = self.process
        if process is None:
            return None
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if process.poll() is not None:
                break
            try:
                process.send_signal(sig)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=timeout if sig == signal.SIGINT else 15)
            except subprocess.TimeoutExpired:
                print(f"server {self.key}: still running {timeout:.0f}s after {sig.name}", file=sys.stderr)
        self.exit_code = process.wait()
        return self.exit_code


def build_servers(args: argparse.Namespace, scratch: Path) -> list[Server]:
    """Server A (Token Recycling defaults) and server B (plain one-token decoding)."""
    common = ["serve", args.model, "--host", "127.0.0.1", "--port", "0", "--dtype", args.dtype, "--no-save"]
    if args.device:
        common += ["--device", args.device]
    if args.matrix_state == "cold":
        common.append("--cold")
    variants = [
        ("A", "Token Recycling (--tree auto)", ["--tree", "auto"]),
        ("B", "plain (--tree none --lookup 0)", ["--tree", "none", "--lookup", "0"]),
    ]
    servers = []
    for key, label, extra in variants:
        home = scratch / f"server-{key}"
        home.mkdir()
        servers.append(Server(key, label, [str(args.tr), *common, *extra], home))
    return servers


def wait_ready(servers: list[Server], timeout: float) -> None:
    """Wait until every server has printed its listening line and answers /health."""
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        pending = [server for server in pending if not server.poll_ready()]
        if not pending:
            return
        if time.monotonic() > deadline:
            names = ", ".join(server.key for server in pending)
            raise ServerDied(f"server(s) {names} not ready after {timeout:.0f}s")
        time.sleep(0.5)


def extension(obj: Any) -> dict[str, Any] | None:
    """The `tr` extension object of a response or chunk (pydantic extra field), if present."""
    extra = getattr(obj, "model_extra", None) or {}
    value = extra.get("tr")
    return value if isinstance(value, dict) else None


def stream_once(client: Any, model: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """One streamed greedy chat completion; client-side timings plus the server's `tr` extension."""
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    first: float | None = None
    parts: list[str] = []
    usage: Any = None
    tr: dict[str, Any] | None = None
    finish_reason: str | None = None
    chunks = 0
    for chunk in stream:
        now = time.perf_counter()
        chunks += 1
        tr = extension(chunk) or tr
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            tr = extension(choice) or tr
            content = choice.delta.content if choice.delta is not None else None
            if content:
                if first is None:
                    first = now - start
                parts.append(content)
            if choice.finish_reason is not None:
                finish_reason = choice.finish_reason
    total = time.perf_counter() - start
    completion = usage.completion_tokens if usage is not None else None
    record: dict[str, Any] = {
        "text": "".join(parts),
        "finish_reason": finish_reason,
        "chunks": chunks,
        "prompt_tokens": usage.prompt_tokens if usage is not None else None,
        "completion_tokens": completion,
        "ttft_s": first,
        "total_s": total,
        "client_tps": completion / total if completion is not None and total > 0 else None,
        "decode_tps": None,
        "server_overhead_s": None,
        "tr": tr,
    }
    if completion is not None and first is not None and completion > 1 and total > first:
        record["decode_tps"] = (completion - 1) / (total - first)
    if tr is not None and first is not None:
        prefill, queue = tr.get("prefill_seconds"), tr.get("queue_seconds")
        if isinstance(prefill, (int, float)) and isinstance(queue, (int, float)):
            record["server_overhead_s"] = first - prefill - queue
    return record


def model_id(client: Any) -> str:
    """The id the server lists first under /v1/models."""
    models = client.models.list().data
    if not models:
        raise ServerDied("GET /v1/models listed no model")
    return models[0].id


def values(records: list[dict[str, Any]], key: str, scale: float = 1.0) -> list[float]:
    """The numeric values of one metric ("tr.NAME" reads the server extension), scaled."""
    out = []
    for record in records:
        value = (record.get("tr") or {}).get(key[3:]) if key.startswith("tr.") else record.get(key)
        if isinstance(value, (int, float)):
            out.append(value * scale)
    return out


METRICS = (
    ("client tok/s", "client_tps", 1.0, 1),
    ("decode tok/s", "decode_tps", 1.0, 1),
    ("TTFT ms", "ttft_s", 1000.0, 0),
    ("server overhead ms", "server_overhead_s", 1000.0, 1),
    ("MAT", "tr.mean_accepted_tokens", 1.0, 2),
    ("server tok/s (tr)", "tr.tokens_per_second", 1.0, 1),
    ("prefill ms (tr)", "tr.prefill_seconds", 1000.0, 0),
)


def summarise(records: list[dict[str, Any]], keys: list[str]) -> dict[str, Any]:
    """Medians and means per server, A/B speedups, identical-output count."""
    by_server = {key: [r for r in records if r["server"] == key] for key in keys}
    summary: dict[str, Any] = {"servers": {}}
    for key, rows in by_server.items():
        stats: dict[str, Any] = {"requests": len(rows), "missing_tr": sum(1 for r in rows if r.get("tr") is None)}
        for _name, metric, scale, _digits in METRICS:
            found = values(rows, metric, scale)
            stats[metric] = {
                "median": statistics.median(found) if found else None,
                "mean": statistics.fmean(found) if found else None,
                "n": len(found),
            }
        stats["completion_tokens"] = sum(r["completion_tokens"] or 0 for r in rows)
        stats["total_s"] = sum(r["total_s"] for r in rows)
        summary["servers"][key] = stats

    pairs: dict[Any, dict[str, dict[str, Any]]] = {}
    for record in records:
        pairs.setdefault((record["index"], record.get("turn", 1)), {})[record["server"]] = record
    a_key, b_key = keys
    complete = [p for p in pairs.values() if a_key in p and b_key in p]

    def decode_part(record: dict[str, Any]) -> tuple[float, float] | None:
        tokens, first, total = record["completion_tokens"], record["ttft_s"], record["total_s"]
        return (tokens - 1, total - first) if tokens and first is not None else None

    def client_part(record: dict[str, Any]) -> tuple[float, float] | None:
        tokens = record["completion_tokens"]
        return (tokens, record["total_s"]) if tokens is not None else None

    def aggregate(part: Callable[[dict[str, Any]], tuple[float, float] | None]) -> float | None:
        """A's summed tokens / summed seconds over B's, on prompts where both have a value."""
        both = [(part(p[a_key]), part(p[b_key])) for p in complete]
        both = [(x, y) for x, y in both if x is not None and y is not None]
        rates = []
        for side in (0, 1):
            seconds = sum(pair[side][1] for pair in both)
            rates.append(sum(pair[side][0] for pair in both) / seconds if seconds > 0 else None)
        return rates[0] / rates[1] if rates[0] is not None and rates[1] else None

    def per_prompt(metric: str) -> float | None:
        ratios = [p[a_key][metric] / p[b_key][metric] for p in complete if p[a_key][metric] and p[b_key][metric]]
        return statistics.median(ratios) if ratios else None

    summary["speedup"] = {
        "client_tps": {"summed": aggregate(client_part), "median_per_prompt": per_prompt("client_tps")},
        "decode_tps": {"summed": aggregate(decode_part), "median_per_prompt": per_prompt("decode_tps")},
    }
    summary["identical"] = sum(1 for p in complete if p[a_key]["text"] == p[b_key]["text"])
    # KV reuse on later turns: the share of their prompt tokens the server did not prefill again.
    for key, rows in by_server.items():
        later = [r for r in rows if r.get("turn", 1) > 1 and r.get("tr") and r.get("prompt_tokens")]
        prompt = sum(r["prompt_tokens"] for r in later)
        reused = sum(r["tr"].get("prompt_tokens_reused", 0) for r in later)
        summary["servers"][key]["later_turn_reuse"] = {
            "requests": len(later),
            "prompt_tokens": prompt,
            "reused": reused,
        }
    summary["compared"] = len(complete)
    return summary


def fmt(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def to_markdown(header: dict[str, Any], servers: list[Server], summary: dict[str, Any]) -> str:
    a, b = servers
    lines = [
        "# tr serve: client-side benchmark",
        "",
        f"- model: {header['model']}, dtype: {header['dtype']}, device: {header['device'] or 'server default'}",
        f"- prompts: {header['prompts']} ({header['n_prompts']} prompts, turns: {header['turns']}, round-robin over "
        f"{header['n_categories']} categories), max tokens: {header['max_tokens']}",
        f"- matrix state at start: {header['matrix_state']}; CPU threads (os.cpu_count): {header['cpu_count']}",
        f"- date: {header['date']}; host: {header['platform']}; openai SDK {header['openai']}",
        f"- A = {a.label}; B = {b.label}",
        "",
        "| metric | A median | A mean | B median | B mean |",
        "|---|---:|---:|---:|---:|",
    ]
    stats_a, stats_b = summary["servers"][a.key], summary["servers"][b.key]
    for name, metric, _scale, digits in METRICS:
        cells = [
            fmt(stats_a[metric]["median"], digits),
            fmt(stats_a[metric]["mean"], digits),
            fmt(stats_b[metric]["median"], digits),
            fmt(stats_b[metric]["mean"], digits),
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    speed = summary["speedup"]
    lines += [
        "",
        "| speedup A/B | summed tokens / summed time | median of per-prompt ratios |",
        "|---|---:|---:|",
        *(
            f"| {name} | {fmt(speed[key]['summed'], 2)}x | {fmt(speed[key]['median_per_prompt'], 2)}x |"
            for name, key in (("client tok/s", "client_tps"), ("decode tok/s", "decode_tps"))
        ),
        "",
        f"Identical outputs A vs B: {summary['identical']} / {summary['compared']}",
        f"Completion tokens: A {stats_a['completion_tokens']}, B {stats_b['completion_tokens']}",
    ]
    for server in servers:
        reuse = summary["servers"][server.key]["later_turn_reuse"]
        if reuse["requests"]:
            lines.append(
                f"Later turns on {server.key}: {reuse['reused']:,} of {reuse['prompt_tokens']:,} prompt tokens "
                f"({reuse['reused'] / reuse['prompt_tokens']:.1%}) came from the KV cache "
                f"({reuse['requests']} requests)"
            )
    missing = [
        f"{s.key}: {summary['servers'][s.key]['missing_tr']}"
        for s in servers
        if summary["servers"][s.key]["missing_tr"]
    ]
    if missing:
        lines.append(f"Responses without a `tr` extension: {', '.join(missing)}")
    lines.append(f"Server exit codes: A {a.exit_code}, B {b.exit_code}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark `tr serve` (Token Recycling) against plain decoding from the client side.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", default="smollm2", help="MODEL argument of both servers")
    parser.add_argument("--dtype", default="bfloat16", choices=("auto", "float32", "bfloat16"), help="both servers")
    parser.add_argument("--device", help="--device of both servers (None: the server default)")
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="JSONL with category and turns")
    parser.add_argument("--limit", type=int, default=20, help="prompts, round-robin over categories")
    parser.add_argument(
        "--turns", type=int, choices=(1, 2), default=1, help="turns per prompt (2: MT-Bench follow-ups, KV reuse)"
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="max_tokens of every request")
    parser.add_argument(
        "--matrix-state",
        choices=("seeded", "cold"),
        default="seeded",
        help="seeded: the shipped starter matrix of a fresh TR_HOME; cold: --cold (empty matrix)",
    )
    parser.add_argument("--json", type=Path, help="write raw per-request records and the summary here")
    parser.add_argument("--tr", type=Path, default=Path(sys.executable).parent / "tr", help="the tr executable")
    parser.add_argument("--startup-timeout", type=float, default=900.0, help="seconds for both servers to be ready")
    parser.add_argument("--request-timeout", type=float, default=900.0, help="seconds per request")
    parser.add_argument("--stop-timeout", type=float, default=120.0, help="seconds to wait after SIGINT")
    parser.add_argument("--keep-temp", action="store_true", help="keep the temp TR_HOMEs (kept anyway on failure)")
    args = parser.parse_args(argv)
    if args.limit < 1 or args.max_tokens < 1:
        parser.error("--limit and --max-tokens must be positive")
    return args


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def measure(
    args: argparse.Namespace, servers: list[Server], prompts: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Start both servers, warm them up, then send every prompt to each, alternating the order."""
    from openai import OpenAI

    cache = real_cache_dir()
    started = time.perf_counter()
    # One after the other: A measures t(N) for its tree design at start, which B loading beside it
    # would distort.
    for server in servers:
        print(f"+ TR_HOME={server.home} {' '.join(server.command)}", flush=True)
        server.start(cache)
        wait_ready([server], args.startup_timeout)
    print(f"both servers ready after {time.perf_counter() - started:.1f}s", flush=True)

    # No retries: a retried request would be timed as one slow request.
    clients = {
        s.key: OpenAI(base_url=s.base_url, api_key="none", timeout=args.request_timeout, max_retries=0) for s in servers
    }
    models = {s.key: model_id(clients[s.key]) for s in servers}
    for server in servers:
        warm = stream_once(
            clients[server.key], models[server.key], [{"role": "user", "content": WARMUP_PROMPT}], args.max_tokens
        )
        print(f"warm-up {server.key}: {warm['completion_tokens']} tokens in {warm['total_s']:.2f}s", flush=True)
        if warm["tr"] is None:
            print(f"warning: server {server.key} sent no `tr` extension in its stream", file=sys.stderr)
        if warm["completion_tokens"] is None:
            print(f"warning: server {server.key} sent no usage chunk (include_usage)", file=sys.stderr)

    records: list[dict[str, Any]] = []
    for index, item in enumerate(prompts):
        order = servers if index % 2 == 0 else servers[::-1]
        line = [f"[{index + 1}/{len(prompts)}] {item['category']} #{item['question_id']}:"]
        for position, server in enumerate(order):
            # Later turns resend the whole conversation, this server's own replies included, as a
            # chat client does: the server prefills only what its KV cache does not hold.
            messages: list[dict[str, str]] = []
            for turn, text in enumerate(item["turns"][: args.turns], start=1):
                server.check_alive()
                messages.append({"role": "user", "content": text})
                record = stream_once(clients[server.key], models[server.key], messages, args.max_tokens)
                messages.append({"role": "assistant", "content": record["text"]})
                record.update(
                    index=index,
                    turn=turn,
                    question_id=item["question_id"],
                    category=item["category"],
                    server=server.key,
                )
                record["position"] = position
                records.append(record)
                mat = (record["tr"] or {}).get("mean_accepted_tokens")
                ttft = record["ttft_s"] * 1000 if record["ttft_s"] is not None else None
                line.append(
                    f"{server.key}{turn} {record['completion_tokens']} tok {fmt(record['client_tps'], 1)} tok/s "
                    f"TTFT {fmt(ttft, 0)} ms MAT {fmt(mat, 2)}"
                )
        print("  ".join(line), flush=True)
    return records, models


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import openai

    prompts = load_prompts(args.prompts, args.limit, args.turns)
    if not prompts:
        print(f"no prompts in {args.prompts}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)  # so `finally` stops the servers

    scratch = Path(tempfile.mkdtemp(prefix="serve_bench_"))
    servers = build_servers(args, scratch)
    status: int | None = None
    try:
        records, models = measure(args, servers, prompts)
    except (ServerDied, openai.APIError) as error:
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 130
    except Exception:
        status = 1
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for server in servers:
            if status is not None and server.process is not None and not server.alive():
                print(f"--- server {server.key} exited early ({server.process.poll()}); stderr tail:", file=sys.stderr)
                print(tail(server.stderr_path), file=sys.stderr)
            code = server.stop(args.stop_timeout)
            print(f"server {server.key} stopped: exit code {code}", file=sys.stderr, flush=True)
        if status is not None or args.keep_temp:
            print(f"temp dirs (logs in server-*/stderr.log) kept in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    if status is not None:
        return status

    header = {
        "model": args.model,
        "dtype": args.dtype,
        "device": args.device,
        "prompts": str(args.prompts),
        "n_prompts": len(prompts),
        "n_categories": len({item["category"] for item in prompts}),
        "max_tokens": args.max_tokens,
        "turns": args.turns,
        "matrix_state": args.matrix_state,
        "cpu_count": os.cpu_count(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "openai": openai.__version__,
        "commands": {s.key: s.command for s in servers},
        "labels": {s.key: s.label for s in servers},
        "served_models": models,
    }
    summary = summarise(records, [s.key for s in servers])
    summary["exit_codes"] = {s.key: s.exit_code for s in servers}
    print()
    print(to_markdown(header, servers, summary), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"header": header, "summary": summary, "records": records}, indent=2) + "\n")
        print(f"\nwrote {args.json}", flush=True)
    bad_exit = [s.key for s in servers if s.exit_code != 0]
    if bad_exit:
        print(f"warning: server(s) {', '.join(bad_exit)} did not exit with 0", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
