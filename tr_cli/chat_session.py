"""`tr chat` without the terminal: conversation state, the chat template, slash commands.

No prompt-toolkit or Rich here (tr_cli/cli/chat.py draws and reads; tr_cli/view.py renders), so
everything in this module is driven directly by tests.

Multi-turn from the KV cache: the decoder holds the exact token ids of the conversation so far
(prompt turns + generated replies, the last one still pending). For the next turn the whole
conversation is rendered with the chat template and only the text that follows what the decoder
already holds is tokenized and fed. What the decoder holds is known as text: the rendering that
was fed + the reply decoded with its special tokens. When the template writes the history
differently (it closes a reply cut short by Ctrl-C or max_new_tokens: that lands in the suffix;
it rewrites earlier turns: that does not), the prefix no longer matches and the conversation is
re-prefilled from scratch instead: slower, never wrong.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .core import GenerationStats, StepEvent, StopCondition, TokenRecyclingDecoder
from .core.sampling import SamplingConfig, check_settings, wants_sampling
from .text import has_chat_template

LIVE_MODES = ("path", "tree", "off")
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "seed")
SETTING_KEYS = ("max_new_tokens", *SAMPLING_KEYS, "live", "verbose")
SHOW_TOPICS = ("settings", "model", "template", "matrix")
SAVE_FORMAT = "tr-chat"
SAVE_VERSION = 1
BLOCK_QUOTE = '"""'

_TRUE = {"on", "true", "yes", "1"}
_FALSE = {"off", "false", "no", "0"}


class CommandError(Exception):
    """A slash command that cannot run as typed; the message says why (nothing is sent to the model)."""


class ContextFull(CommandError):
    """The conversation leaves no room in the model's context for another reply."""


# --------------------------------------------------------------------------------------------
# Settings


@dataclass
class Settings:
    max_new_tokens: int = 512
    live: str = "path"
    verbose: bool = False
    # Sampling as the user asked for it (None: not given; the model's generation config, else
    # transformers' default, applies). Greedy unless wants_sampling() says otherwise.
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None

    def sampling_config(self, generation_config: object | None) -> SamplingConfig:
        """What the decoder samples with (greedy when no sampling was asked for)."""
        if not wants_sampling(self.temperature, self.top_p, self.top_k, self.repetition_penalty):
            return SamplingConfig.greedy()
        return SamplingConfig.resolve(generation_config, temperature=self.temperature, top_p=self.top_p,
                                      top_k=self.top_k, repetition_penalty=self.repetition_penalty, seed=self.seed)

    def _set_sampling(self, key: str, value: str) -> str:
        lowered = value.lower()
        if not value:
            raise CommandError(f"usage: /set {key} VALUE ({'a number or random' if key == 'seed' else 'a number or default'})")
        if (key == "seed" and lowered in ("random", "none")) or (key != "seed" and lowered in ("default", "none")):
            setattr(self, key, None)
            return f"{key} = {'random' if key == 'seed' else 'default'}"
        whole = key in ("top_k", "seed")
        try:
            number = int(value) if whole else float(value)
        except ValueError:
            raise CommandError(f"{key} takes {'a whole number' if whole else 'a number'}, got {value!r}") from None
        problem = check_settings(**{key: number})
        if problem:
            raise CommandError(problem)
        setattr(self, key, number)
        return f"{key} = {number:g}" if not whole else f"{key} = {number}"

    def set(self, key: str, value: str) -> str:
        """Apply `/set KEY VALUE`; returns what to tell the user."""
        key = key.strip().lower().replace("-", "_")
        value = value.strip()
        if key in SAMPLING_KEYS:
            return self._set_sampling(key, value)
        if key == "max_new_tokens":
            try:
                number = int(value)
            except ValueError:
                raise CommandError(f"max_new_tokens takes a whole number, got {value!r}") from None
            if number < 1:
                raise CommandError(f"max_new_tokens must be at least 1, got {number}")
            self.max_new_tokens = number
            return f"max_new_tokens = {number}"
        if key == "live":
            if value not in LIVE_MODES:
                raise CommandError(f"live takes one of {', '.join(LIVE_MODES)}, got {value!r}")
            self.live = value
            return f"live = {value}"
        if key == "verbose":
            lowered = value.lower()
            if lowered in _TRUE or not lowered:
                self.verbose = True
            elif lowered in _FALSE:
                self.verbose = False
            else:
                raise CommandError(f"verbose takes on or off, got {value!r}")
            return f"verbose = {'on' if self.verbose else 'off'}"
        if not key:
            raise CommandError(f"usage: /set KEY VALUE ({', '.join(SETTING_KEYS)})")
        raise CommandError(f"no setting {key!r}; settings: {', '.join(SETTING_KEYS)}")

    def describe(self, sampling: SamplingConfig | None = None) -> list[tuple[str, str]]:
        """(name, value) rows; `sampling` is what the decoder uses (these settings merged with the
        model's generation config)."""
        return [
            ("max_new_tokens", str(self.max_new_tokens)),
            ("live", self.live),
            ("verbose", "on" if self.verbose else "off"),
            ("decoding", (sampling or self.sampling_config(None)).describe()),
        ]


# --------------------------------------------------------------------------------------------
# Slash commands


@dataclass(frozen=True)
class CommandSpec:
    name: str
    aliases: tuple[str, ...]
    usage: str
    help: str
    arguments: tuple[str, ...] = ()  # completions of the first argument


COMMANDS: tuple[CommandSpec, ...] = (
    CommandSpec("/help", ("/?",), "", "list the commands"),
    CommandSpec("/clear", (), "", "forget the conversation (the matrix stays)"),
    CommandSpec("/system", (), "[TEXT]", "show or set the system prompt (/system - removes it)"),
    CommandSpec("/set", (), "KEY VALUE",
                "max_new_tokens N, temperature T (0 = greedy), top_p P, top_k K, repetition_penalty R, seed N|random, "
                "live path|tree|off, verbose on|off", SETTING_KEYS),
    CommandSpec("/show", (), "TOPIC", "settings, model, template or matrix", SHOW_TOPICS),
    CommandSpec("/save", (), "FILE", "write the conversation to a JSON file"),
    CommandSpec("/load", (), "FILE", "continue a conversation written by /save"),
    CommandSpec("/retry", (), "", "generate the last reply again"),
    CommandSpec("/bye", ("/exit",), "", "save the matrix and leave (also Ctrl-D)"),
)
_BY_NAME = {name: spec for spec in COMMANDS for name in (spec.name, *spec.aliases)}
_SET_VALUES = {"live": LIVE_MODES, "verbose": ("on", "off"), "seed": ("random",), "top_p": ("default",),
               "top_k": ("default",), "repetition_penalty": ("default",), "temperature": ("default",)}


def help_lines() -> list[tuple[str, str]]:
    """(command with usage, what it does) rows for /help."""
    rows = []
    for spec in COMMANDS:
        names = ", ".join((spec.name, *spec.aliases))
        rows.append((f"{names} {spec.usage}".rstrip(), spec.help))
    rows.append(('"""', 'start a multi-line message; end it with a line ending in """'))
    rows.append(("//text", "send a message that starts with '/' (as /text)"))
    return rows


def parse_command(line: str) -> tuple[str, str]:
    """`/name arg...` -> (canonical name, argument text). Unknown names raise CommandError."""
    stripped = line.strip()
    name, _, arg = stripped.partition(" ")
    spec = _BY_NAME.get(name.lower())
    if spec is None:
        raise CommandError(f"Unknown command {name} — /help lists them")
    return spec.name, arg.strip()


def complete(text: str) -> list[str]:
    """Completions of a partly typed slash command line (for tab completion): full replacements
    of the last word."""
    if not text.startswith("/"):
        return []
    words = text.split(" ")
    if len(words) == 1:
        prefix = words[0].lower()
        names = [n for spec in COMMANDS for n in (spec.name, *spec.aliases)]
        return [n for n in names if n.startswith(prefix)]
    spec = _BY_NAME.get(words[0].lower())
    if spec is None:
        return []
    if len(words) == 2:
        return [a for a in spec.arguments if a.startswith(words[1].lower())]
    if len(words) == 3 and spec.name == "/set":
        return [v for v in _SET_VALUES.get(words[1].lower(), ()) if v.startswith(words[2].lower())]
    return []


class MultilineInput:
    '''Gathers `"""`-quoted messages over several prompt lines.

    `"""` starts a block (text may follow on the same line); the block ends at the first line
    that ends with `"""`. `"""one line"""` is a block too. Block text is always a message, never
    a command.
    '''

    def __init__(self) -> None:
        self._lines: list[str] | None = None

    @property
    def active(self) -> bool:
        return self._lines is not None

    def cancel(self) -> None:
        self._lines = None

    def feed(self, line: str) -> tuple[str, bool] | None:
        """A prompt line in; (message, was_a_block) once complete, else None (need more lines)."""
        if self._lines is None:
            if not line.lstrip().startswith(BLOCK_QUOTE):
                return line, False
            rest = line.lstrip()[len(BLOCK_QUOTE):]
            if rest.rstrip().endswith(BLOCK_QUOTE):
                return rest.rstrip()[: -len(BLOCK_QUOTE)], True
            self._lines = [rest] if rest.strip() else []
            return None
        if line.rstrip().endswith(BLOCK_QUOTE):
            last = line.rstrip()[: -len(BLOCK_QUOTE)]
            if last.strip():
                self._lines.append(last)
            text = "\n".join(self._lines)
            self._lines = None
            return text, True
        self._lines.append(line)
        return None


# --------------------------------------------------------------------------------------------
# Conversation files


def conversation_to_json(system: str | None, messages: list[dict], model_id: str | None = None) -> dict:
    return {
        "format": SAVE_FORMAT,
        "version": SAVE_VERSION,
        "model": model_id,
        "system": system,
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
    }


def conversation_from_json(data: object) -> tuple[str | None, list[dict]]:
    """(system, messages) from what /save writes, or from a plain list of {role, content}."""
    if isinstance(data, list):
        data = {"messages": data}
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise ValueError('expected {"messages": [{"role": ..., "content": ...}, ...]}')
    system = data.get("system")
    if system is not None and not isinstance(system, str):
        raise ValueError('"system" must be text')
    messages: list[dict] = []
    for i, m in enumerate(data["messages"]):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i + 1} has no text content")
        role = m.get("role")
        if role == "system" and not messages:
            system = m["content"]
            continue
        if role not in ("user", "assistant"):
            raise ValueError(f"message {i + 1} has role {role!r}; expected user or assistant")
        messages.append({"role": role, "content": m["content"]})
    return system or None, messages


# --------------------------------------------------------------------------------------------
# The session


@dataclass
class TurnResult:
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stats: GenerationStats = field(default_factory=GenerationStats)
    interrupted: bool = False
    rebuilt: bool = False  # the whole conversation was prefilled (first turn, /retry, /load, ...)
    input_tokens: int = 0


def context_limit(model) -> int | None:
    """The model's maximum positions, where the config states one."""
    try:
        config = model.config.get_text_config(decoder=True)
    except (AttributeError, TypeError):
        config = getattr(model, "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


class ChatSession:
    """One conversation over a TokenRecyclingDecoder: what to feed each turn, replies, commands."""

    def __init__(
        self,
        tokenizer,
        decoder: TokenRecyclingDecoder,
        eos_token_ids: list[int],
        system: str | None = None,
        settings: Settings | None = None,
        max_positions: int | None = None,
        model_id: str | None = None,
        topics: Mapping[str, Callable[[], str]] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.decoder = decoder
        self.eos_token_ids = list(eos_token_ids)
        self.system = system or None
        self.settings = settings or Settings()
        self.max_positions = max_positions
        self.model_id = model_id
        self.topics = dict(topics or {})
        self.templated = has_chat_template(tokenizer)
        self.messages: list[dict] = []
        self.stats = GenerationStats()  # of the turn being generated (read by the live view)
        self.last: TurnResult | None = None
        self._held = ""  # the text the decoder's tokens stand for (template mode)
        self._stale = False  # decoder state no longer matches the messages: re-prefill next turn
        self.apply_sampling()

    # -- state ------------------------------------------------------------------------------

    def clear(self) -> None:
        """Forget the conversation (the matrix, the system prompt and the settings stay)."""
        self.messages = []
        self.decoder.reset()
        self._held = ""
        self._stale = False

    def apply_sampling(self) -> None:
        """Give the decoder the settings' sampling (merged with the model's generation config);
        a seeded stream starts again from its seed."""
        self.decoder.set_sampling(self.settings.sampling_config(getattr(self.decoder.model, "generation_config", None)))

    def set_system(self, text: str | None) -> None:
        self.system = text or None
        if self.decoder.tokens:
            self._stale = True

    def replace(self, system: str | None, messages: list[dict]) -> None:
        """Take over another conversation (/load); prefilled at the next turn."""
        self.system = system
        self.messages = [dict(m) for m in messages]
        self.decoder.reset()
        self._held = ""
        self._stale = bool(self.messages)

    def abandon_turn(self) -> None:
        """A reply failed midway (an error, not Ctrl-C): drop its message; the decoder state is
        unknown, so the conversation is prefilled again at the next turn."""
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()
        self.decoder.reset()
        self._held = ""
        self._stale = bool(self.messages)

    # -- turns ------------------------------------------------------------------------------

    def _history(self) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.messages

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        except Exception as exc:  # jinja2 TemplateError from the template's own checks, and friends
            raise CommandError(f"the chat template rejects this conversation: {exc}") from None

    def _encode(self, text: str, special: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def prepare(self, user_text: str) -> tuple[list[int], bool, str]:
        """Token ids to feed for the next user message, whether the decoder must start over, and
        the rendering they complete (template mode). Changes nothing."""
        conversation = self._history() + [{"role": "user", "content": user_text}]
        continuing = bool(self.decoder.tokens) and not self._stale
        if self.templated:
            text = self.render(conversation, add_generation_prompt=True)
            if continuing and text.startswith(self._held):
                return self._encode(text[len(self._held):]), False, text
            return self._encode(text), True, text
        if continuing:
            return self._encode(user_text), False, ""
        pieces = ([self.system + "\n\n"] if self.system else []) + [m["content"] for m in self.messages] + [user_text]
        ids = self._encode(pieces[0], special=True)
        for piece in pieces[1:]:
            ids += self._encode(piece)
        return ids, True, ""

    def _budget(self, n_input: int, rebuild: bool) -> int:
        wanted = self.settings.max_new_tokens
        if self.max_positions is None:
            return wanted
        held = 0 if rebuild else len(self.decoder.tokens)
        room = self.max_positions - held - n_input - self.decoder.max_depth
        if room < 1:
            raise ContextFull(
                f"the conversation fills the model's context ({self.max_positions:,} tokens); /clear starts a new one"
            )
        return min(wanted, room)

    def reply(self, user_text: str, stop_requested: Callable[[], bool] | None = None) -> Iterator[StepEvent]:
        """Send a user message; yields the decoder's step events. Between events (the cache is
        consistent there) `stop_requested()` is asked whether to stop (Ctrl-C). The reply is in
        `self.messages` and `self.last` once the iteration ends."""
        ids, rebuild, rendered = self.prepare(user_text)
        max_new = self._budget(len(ids), rebuild)
        self.messages.append({"role": "user", "content": user_text})
        return self._run(ids, rebuild, rendered, max_new, stop_requested)

    def retry(self, stop_requested: Callable[[], bool] | None = None) -> Iterator[StepEvent]:
        """Drop the last reply and generate it again (from a fresh prefill)."""
        if not self.messages:
            raise CommandError("nothing to retry yet")
        saved = list(self.messages)
        if self.messages[-1]["role"] == "assistant":
            self.messages.pop()
        if not self.messages or self.messages[-1]["role"] != "user":
            self.messages = saved
            raise CommandError("nothing to retry: the conversation does not end with a message of yours")
        user = self.messages.pop()["content"]
        was_stale, self._stale = self._stale, True
        try:
            return self.reply(user, stop_requested)
        except CommandError:
            self.messages, self._stale = saved, was_stale
            raise

    def _run(self, ids: list[int], rebuild: bool, rendered: str, max_new: int,
             stop_requested: Callable[[], bool] | None) -> Iterator[StepEvent]:
        if rebuild:
            self.decoder.reset()
        stop = StopCondition.build(max_new, self.eos_token_ids)
        result = TurnResult(rebuilt=rebuild, input_tokens=len(ids))
        self.stats = result.stats
        result.stats.prompt_tokens = len(ids)
        self._stale = True  # until the reply is recorded
        start = time.perf_counter()
        steps = self.decoder.steps(ids, stop)
        try:
            for event in steps:
                result.tokens.extend(event.new_tokens)
                result.stats.add(event)
                result.stats.wall_seconds = time.perf_counter() - start
                yield event
                if event.finish_reason is None and stop_requested is not None and stop_requested():
                    result.interrupted = True
                    result.stats.finish_reason = "interrupted"
                    break
        finally:
            steps.close()
        result.stats.wall_seconds = time.perf_counter() - start
        # Only reached when the decoder stopped between events: its state is consistent.
        result.text = self.tokenizer.decode(result.tokens, skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": result.text})
        if self.templated:
            self._held = rendered + self.tokenizer.decode(result.tokens, skip_special_tokens=False)
        self._stale = False
        self.last = result

    # -- commands ---------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        target = Path(path).expanduser()
        data = conversation_to_json(self.system, self.messages, self.model_id)
        try:
            target.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot write {target}: {exc.strerror or exc}") from None
        return target

    def load(self, path: str | Path) -> int:
        source = Path(path).expanduser()
        try:
            data = json.loads(source.read_text(encoding="utf-8"))
            system, messages = conversation_from_json(data)
        except OSError as exc:
            raise CommandError(f"cannot read {source}: {exc.strerror or exc}") from None
        except ValueError as exc:  # JSONDecodeError included
            raise CommandError(f"{source}: not a saved conversation ({exc})") from None
        self.replace(system, messages)
        return len(messages)

    def execute(self, name: str, arg: str) -> tuple[str | None, str | None]:
        """Run a parsed slash command: (text to show, action for the caller: "exit", "retry",
        "help" or None). Raises CommandError for a command that cannot run."""
        if name == "/help":
            return None, "help"
        if name == "/bye":
            return None, "exit"
        if name == "/retry":
            return None, "retry"
        if name == "/clear":
            self.clear()
            return "Conversation cleared (the matrix stays).", None
        if name == "/system":
            if not arg:
                return (f"System prompt: {self.system}" if self.system else "No system prompt."), None
            self.set_system(None if arg == "-" else arg)
            what = "System prompt removed." if arg == "-" else "System prompt set."
            return what + (" The conversation is read again at the next message." if self._stale else ""), None
        if name == "/set":
            if not arg:
                return self.show("settings"), None
            key, _, value = arg.partition(" ")
            message = self.settings.set(key, value)
            if key.strip().lower().replace("-", "_") in SAMPLING_KEYS:
                self.apply_sampling()
                message += f" ({self.decoder.sampling.describe()})"
            return message, None
        if name == "/show":
            return self.show(arg), None
        if name == "/save":
            if not arg:
                raise CommandError("usage: /save FILE")
            target = self.save(arg)
            return f"Saved {len(self.messages)} messages to {target}.", None
        if name == "/load":
            if not arg:
                raise CommandError("usage: /load FILE")
            count = self.load(arg)
            return f"Loaded {count} messages from {Path(arg).expanduser()}; the next message continues it.", None
        raise CommandError(f"Unknown command {name} — /help lists them")

    def show(self, topic: str) -> str:
        topic = topic.strip().lower()
        if topic == "settings":
            rows = self.settings.describe(self.decoder.sampling) + [("system", self.system or "(none)")]
            width = max(len(k) for k, _ in rows)
            return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
        if topic == "template":
            if not self.templated:
                return "No chat template: plain-completion mode (your text is continued as written)."
            return str(self.tokenizer.chat_template)
        if topic in self.topics:
            return self.topics[topic]()
        raise CommandError(f"usage: /show {'|'.join(SHOW_TOPICS)}")
