"""`tr chat` without the terminal: conversation state, turns from the KV cache, slash commands.

No prompt-toolkit or Rich here (tr_cli/cli draws and reads), so everything in this package is
driven directly by tests.

Multi-turn from the KV cache: the decoder holds the exact token ids of the conversation so far
(prompt turns + generated replies, the last one still pending). For the next turn only what
follows them is fed (text/conversation.py): with a chat template, the text after the rendering
the decoder already holds; when the template writes the history differently (it closes a reply
cut short by Ctrl-C or max_new_tokens: that lands in the suffix; it rewrites earlier turns: that
does not), the prefix no longer matches and the conversation is re-prefilled from scratch
instead: slower, never wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..core import StepEvent, StopCondition, TokenRecyclingDecoder
from ..core.errors import PrefillStopped
from ..core.events import GenerationResult, GenerationStats, track
from ..core.stopping import NoRoomForReply, reply_budget
from ..text.conversation import ConversationEncoder, Prompt, TemplateError
from .commands import SHOW_TOPICS
from .errors import CommandError, ContextFull
from .settings import SAMPLING_KEYS, Settings
from .transcript import read_transcript, write_transcript


@dataclass
class TurnResult(GenerationResult):
    text: str = ""
    interrupted: bool = False
    rebuilt: bool = False  # the whole conversation was prefilled (first turn, /retry, /load, ...)
    input_tokens: int = 0


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
        self.encoder = ConversationEncoder(tokenizer)
        self.messages: list[dict] = []
        self.stats = GenerationStats()  # of the turn being generated (read by the live view)
        self.last: TurnResult | None = None
        self._held = ""  # the text the decoder's tokens stand for (template mode)
        self._stale = False  # decoder state no longer matches the messages: re-prefill next turn
        self.piped = False  # messages come from stdin, not a person at a prompt (errors advise accordingly)

    @property
    def templated(self) -> bool:
        """Whether the model has a chat template (else plain-completion mode)."""
        return self.encoder.templated

    # -- state ------------------------------------------------------------------------------

    def clear(self) -> None:
        """Forget the conversation (the matrix, the system prompt and the settings stay)."""
        self.messages = []
        self.decoder.reset()
        self._held = ""
        self._stale = False

    def apply_sampling(self) -> None:
        """Give the decoder the settings' sampling (merged with the model's generation config),
        after a /set: until then the decoder samples as it was built to (the engine resolved the
        same settings); a seeded stream starts again from its seed."""
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

    def prepare(self, user_text: str) -> Prompt:
        """Token ids to feed for the next user message, whether the decoder must start over, and
        the rendering they complete (template mode). Changes nothing."""
        conversation = self._history() + [{"role": "user", "content": user_text}]
        continuing = bool(self.decoder.tokens) and not self._stale
        try:
            if continuing:
                return self.encoder.continuation(self._held, conversation)
            return self.encoder.encode(conversation)
        except TemplateError as exc:
            raise CommandError(str(exc)) from None

    def _budget(self, n_input: int, rebuild: bool) -> int:
        held = 0 if rebuild else len(self.decoder.tokens)
        try:
            return reply_budget(self.settings.max_new_tokens, self.max_positions, held, n_input, self.decoder.max_depth)
        except NoRoomForReply:
            raise ContextFull(
                self.max_positions,
                piped=self.piped,
                earlier_messages=sum(m["role"] == "user" for m in self.messages),
                system=bool(self.system),
            ) from None

    def reply(self, user_text: str, stop_requested: Callable[[], bool] | None = None) -> Iterator[StepEvent]:
        """Send a user message; yields the decoder's step events. Between events (the cache is
        consistent there) `stop_requested()` is asked whether to stop (Ctrl-C). The reply is in
        `self.messages` and `self.last` once the iteration ends."""
        prompt = self.prepare(user_text)
        max_new = self._budget(len(prompt.ids), prompt.rebuild)
        self.messages.append({"role": "user", "content": user_text})
        return self._run(prompt, max_new, stop_requested)

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

    def _run(self, prompt: Prompt, max_new: int, stop_requested: Callable[[], bool] | None) -> Iterator[StepEvent]:
        if prompt.rebuild:
            self.decoder.reset()
        stop = StopCondition.build(max_new, self.eos_token_ids)
        result = TurnResult(rebuilt=prompt.rebuild, input_tokens=len(prompt.ids))
        result.stats.prompt_tokens = len(prompt.ids)
        self.stats = result.stats
        self._stale = True  # until the reply is recorded
        # The decoder asks too, between prefill chunks: a long message stops within one chunk of
        # Ctrl-C instead of after its whole prefill (it took 30 s on 7,530 tokens).
        steps = self.decoder.steps(prompt.ids, stop, stop_requested)
        read_whole = True
        try:
            for event in track(steps, result):
                yield event
                if event.finish_reason is None and stop_requested is not None and stop_requested():
                    result.interrupted = True
                    result.stats.finish_reason = "interrupted"
                    break
        except PrefillStopped:
            read_whole = False
            result.interrupted = True
            result.stats.finish_reason = "interrupted"
        finally:
            steps.close()
        # Only reached when the decoder stopped between events or prefill chunks: its state is
        # consistent. Cut during the prefill, the reply is empty and the decoder holds part of the
        # message: the next turn reads the conversation again (_stale stays set).
        result.text = self.tokenizer.decode(result.tokens, skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": result.text})
        if read_whole:
            self._held = self.encoder.held_after(prompt, result.tokens)
            self._stale = False
        self.last = result

    # -- commands ---------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        return write_transcript(path, self.system, self.messages, self.model_id)

    def load(self, path: str | Path) -> int:
        system, messages = read_transcript(path)
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
