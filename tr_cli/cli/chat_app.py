"""The terminal side of `tr chat`: reading (prompt-toolkit), drawing replies (the live view),
slash commands, and saving the matrix. Conversation logic lives in tr_cli/chat/."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

import torch
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..chat.commands import help_lines, parse_command
from ..chat.errors import CommandError
from ..chat.multiline import MultilineInput
from ..chat.session import ChatSession
from ..core import StepEvent
from ..core.matrix import rows_filled
from ..engine.engine import Engine
from ..text.streaming import IncrementalDecoder
from .console import note, write_out
from .cursor_position import cursor_position
from .interrupts import DoubleInterrupt, Interrupts, no_echo
from .live_view import LiveView, TokenLabels, stats_line
from .setup import save_state

PROMPT = ">>> "
CONTINUATION = "... "
SAVE_EVERY_SECONDS = 300.0


class ChatApp:
    """The terminal side of a chat: reading, drawing replies, commands, saving the matrix."""

    def __init__(
        self,
        engine: Engine,
        session: ChatSession,
        console: Console,
        err: Console,
        labels: TokenLabels | None = None,
        interrupts: Interrupts | None = None,
        save_every: float = SAVE_EVERY_SECONDS,
    ) -> None:
        self.engine = engine
        self.loaded = engine.loaded
        self.hot = engine.hot
        self.session = session
        self.console = console
        self.err = err
        self.labels = labels or TokenLabels(self.loaded.tokenizer)
        self.interrupts = interrupts or Interrupts()
        self.save_every = save_every
        self.last_save = time.monotonic()
        session.topics.setdefault("model", self.describe_model)
        session.topics.setdefault("matrix", self.describe_matrix)

    # -- matrix -----------------------------------------------------------------------------

    def save(self, final: bool = False) -> None:
        """Write the matrix back; a failure is a warning, never a lost conversation. The final
        save ends the conversation (it joins the store); a periodic one lets it go on."""
        self.last_save = time.monotonic()
        save_state(self.engine, self.err, announce=final or self.session.settings.verbose, end_conversation=final)

    def maybe_save(self) -> None:
        if time.monotonic() - self.last_save >= self.save_every:
            self.save()

    # -- descriptions -----------------------------------------------------------------------

    def describe_model(self) -> str:
        loaded, decoder = self.loaded, self.session.decoder
        params = sum(p.numel() for p in loaded.model.parameters())
        tree = decoder.tree
        context = self.session.max_positions
        template = "yes" if self.session.templated else "none (plain-completion mode)"
        return "\n".join(
            [
                f"{loaded.model_id}",
                f"  {loaded.runtime.dtype_name} on {loaded.runtime.device}, {params / 1e6:,.1f}M parameters, "
                f"vocabulary {loaded.vocab_size:,}, context {f'{context:,}' if context else 'unknown'} tokens",
                f"  draft {decoder.describe()}: depth {tree.depth}, "
                f"widths {'/'.join(map(str, tree.widths()))}; k = {decoder.k}",
                f"  chat template: {template}; {torch.get_num_threads()} CPU threads",
                f"  conversation: {len(self.session.messages)} messages, "
                f"{len(decoder.tokens):,} tokens in the KV cache",
            ]
        )

    def describe_matrix(self) -> str:
        hot = self.hot
        saving = (
            f"saved at exit and every {self.save_every / 60:g} minutes" if hot.save_enabled else "not saved (--no-save)"
        )
        return "\n".join(
            [
                hot.describe(),
                f"  {rows_filled(hot.matrix):,} of {hot.matrix.shape[0]:,} rows filled, "
                f"k = {hot.matrix.shape[1]}; {saving}",
            ]
        )

    def banner(self) -> None:
        for line in self.engine.banner():
            note(line, self.err)
        if not self.session.templated:
            self.caution(
                f"{self.loaded.model_id} has no chat template: plain-completion mode "
                "(your text is continued as written)"
            )

    def hint(self, message: str) -> None:
        """A dim line in the conversation (stdout)."""
        self.console.print(Text(message, style="dim"), soft_wrap=True)

    def caution(self, message: str) -> None:
        """A yellow line in the conversation (stdout): the chat goes on."""
        self.console.print(Text(message, style="yellow"), soft_wrap=True)

    # -- replies ----------------------------------------------------------------------------

    def stream(self, events: Iterable[StepEvent], live: bool) -> None:
        """Draw a reply as its events arrive; Ctrl-C stops it between steps."""
        text = IncrementalDecoder(self.loaded.tokenizer)
        with self.interrupts.deferred(), no_echo(sys.stdin):
            if live:
                view = LiveView(
                    self.console,
                    self.labels,
                    lambda: self.session.stats,
                    self.session.settings.live,
                    cursor_position=lambda: cursor_position(sys.stdin, self.console.file),
                )
                with view:
                    event = None
                    for event in events:
                        view.push(event, text.push(event.new_tokens))
                    if event is not None:  # a reply ending mid-character keeps those bytes
                        view.push(event, text.finish())
            else:  # plain text; Console.out applies no markup, wrapping or highlighting
                last = "\n"
                for event in events:
                    delta = text.push(event.new_tokens)
                    if delta:
                        self.console.out(delta, end="", highlight=False)
                        last = delta[-1]
                delta = text.finish()
                if delta:
                    self.console.out(delta, end="", highlight=False)
                    last = delta[-1]
                if last != "\n":
                    self.console.out("", highlight=False)
        result = self.session.last
        self.console.print(stats_line(result.stats, self.session.settings.verbose), soft_wrap=True)
        self.maybe_save()

    def _live(self) -> bool:
        return self.session.settings.live != "off" and self.console.is_terminal

    def _generate(self, events: Iterable[StepEvent]) -> None:
        """Stream a reply; an error while generating is reported and the chat goes on."""
        try:
            self.stream(events, self._live())
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: keep the conversation
            self.session.abandon_turn()
            self.caution(f"tr: error while generating: {exc}; that message was dropped, the conversation goes on")

    def send(self, message: str) -> None:
        try:
            events = self.session.reply(message, stop_requested=self.interrupts.requested)
        except CommandError as exc:
            self.caution(str(exc))
            return
        self._generate(events)

    def retry(self) -> None:
        events = self.session.retry(stop_requested=self.interrupts.requested)
        self.hint(f"retrying: {self.session.messages[-1]['content']}")
        self._generate(events)

    # -- commands ---------------------------------------------------------------------------

    def show_help(self) -> None:
        table = Table.grid(padding=(0, 2))
        for usage, what in help_lines():
            table.add_row(Text(usage, style="bold"), Text(what))
        self.console.print(table)
        self.hint("Ctrl-C stops a reply; Ctrl-D or /bye leaves.")

    def command(self, line: str) -> bool:
        """Run a slash command; False when the chat should end."""
        try:
            name, arg = parse_command(line)
            message, action = self.session.execute(name, arg)
            if action == "exit":
                return False
            if action == "help":
                self.show_help()
            elif action == "retry":
                self.retry()
            if message:
                self.console.print(Text(message), soft_wrap=True)
        except CommandError as exc:
            self.caution(str(exc))
        return True

    # -- loops ------------------------------------------------------------------------------

    def read(self, prompt_session) -> tuple[str, bool]:
        """One message or command line: (text, typed as a \"\"\" block)."""
        block = MultilineInput()
        try:
            while True:
                line = prompt_session.prompt(CONTINUATION if block.active else PROMPT)
                done = block.feed(line)
                if done is not None:
                    return done
        except KeyboardInterrupt:
            block.cancel()
            raise

    def handle(self, text: str, block: bool) -> bool:
        """One input; False when the chat should end."""
        stripped = text.strip()
        if not block and stripped.startswith("/"):
            if not stripped.startswith("//"):
                return self.command(stripped)
            text = stripped[1:]
        if not text.strip():
            return True
        self.send(text)
        return True

    def repl(self, prompt_session) -> int:
        """The interactive loop; returns the exit status (0, or 130 after a double Ctrl-C)."""
        self.banner()
        self.hint('Type a message; """ starts a multi-line one. /help lists commands; Ctrl-D or /bye leaves.')
        code = 0
        try:
            while True:
                try:
                    try:
                        text, block = self.read(prompt_session)
                    except EOFError:
                        break
                    if not self.handle(text, block):
                        break
                except DoubleInterrupt:
                    raise
                except KeyboardInterrupt:
                    if self.interrupts.hit():
                        raise DoubleInterrupt() from None
                    self.hint("(Ctrl-C again to quit; Ctrl-D or /bye leaves)")
        except DoubleInterrupt:
            code = 130
            self.console.print()
        finally:
            self.save(final=True)
        return code

    def piped(self, messages: list[str]) -> int:
        """Not a terminal: each message in turn, replies as plain text on stdout, status on stderr."""
        self.session.piped = True  # no /clear to suggest when the context fills up
        self.banner()
        out = self.console.file
        try:
            for message in messages:
                events = self.session.reply(message)  # a CommandError ends a piped chat (one line)
                text = IncrementalDecoder(self.loaded.tokenizer)
                for event in events:
                    write_out(text.push(event.new_tokens), out)
                write_out(text.finish() + "\n", out)
                self.err.print(stats_line(self.session.last.stats, self.session.settings.verbose))
        finally:
            self.save(final=True)
        return 0
