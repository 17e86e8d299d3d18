"""`tr chat`: a conversation with Token Recycling, continued from the KV cache turn after turn.

In a terminal: prompt-toolkit reads (history, `\"\"\"` blocks, bracketed paste, tab completion of
slash commands), replies stream above a small live panel of the latest decode step (tr_cli/view.py).
Piped: stdin is the message (or one message per line with --each-line), the reply goes to stdout
as plain text, status to stderr. Conversation logic lives in tr_cli/chat_session.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..chat_session import (
    LIVE_MODES,
    ChatSession,
    CommandError,
    MultilineInput,
    Settings,
    complete,
    context_limit,
    help_lines,
    parse_command,
)
from ..core import StepEvent
from ..core.matrix import rows_filled
from ..errors import UserError
from ..paths import data_dir
from ..text import IncrementalDecoder
from ..view import LiveView, TokenLabels, stats_line
from . import common
from .common import (
    ColdOpt,
    DeviceOpt,
    DtypeOpt,
    KOpt,
    LookupOpt,
    MatrixPathOpt,
    ModelArg,
    NoSaveOpt,
    RepetitionPenaltyOpt,
    SamplingSeedOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
    TreeOpt,
    fail,
    load_with_progress,
    make_decoder,
    open_matrix,
    sampling_config,
    sampling_request,
    tree_option,
    tree_summary,
    user_errors,
)

PROMPT = ">>> "
CONTINUATION = "... "
SAVE_EVERY_SECONDS = 300.0
DOUBLE_INTERRUPT_SECONDS = 1.0
HISTORY_FILE = "chat_history"


class DoubleInterrupt(KeyboardInterrupt):
    """A second Ctrl-C within a second: leave (saving the matrix), exit status 130."""


class Interrupts:
    """Ctrl-C bookkeeping shared by the prompt and generation.

    While generating, SIGINT only sets a flag that the session checks between decode steps (the
    KV cache is consistent there), so a reply stops cleanly; a second Ctrl-C within a second
    raises DoubleInterrupt.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last = float("-inf")
        self.pending = False

    def hit(self) -> bool:
        """Record a Ctrl-C; True when it is the second within DOUBLE_INTERRUPT_SECONDS."""
        now = self.clock()
        double = now - self.last < DOUBLE_INTERRUPT_SECONDS
        self.last = now
        return double

    def requested(self) -> bool:
        return self.pending

    def _handler(self, signum, frame) -> None:
        if self.hit():
            raise DoubleInterrupt()
        self.pending = True

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """SIGINT raises the flag instead of KeyboardInterrupt inside this block."""
        self.pending = False
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _no_echo(stream) -> Iterator[None]:
    """Keys typed while a reply streams are not echoed into it (they still reach the next prompt)."""
    try:
        import termios

        fd = stream.fileno()
        if not os.isatty(fd):
            raise OSError
        old = termios.tcgetattr(fd)
    except (ImportError, OSError, ValueError, AttributeError):
        yield
        return
    new = list(old)
    new[3] &= ~(termios.ECHO | getattr(termios, "ECHOCTL", 0))
    termios.tcsetattr(fd, termios.TCSANOW, new)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, old)


def _history():
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    if os.environ.get("TR_NOHISTORY", "") not in ("", "0"):
        return InMemoryHistory()
    path = data_dir() / HISTORY_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    except OSError as exc:
        common.stderr.print(Text(f"tr: warning: no input history ({path}: {exc.strerror or exc})", style="yellow"))
        return InMemoryHistory()
    return FileHistory(str(path))


def make_prompt_session(no_color: bool = False, input=None, output=None):
    """prompt-toolkit session: history file, tab completion of slash commands, bracketed paste."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import Completer, Completion
    from prompt_toolkit.output import ColorDepth

    class SlashCompleter(Completer):
        def get_completions(self, document, complete_event):
            text = document.text_before_cursor
            if "\n" in text:
                return
            word = text.split(" ")[-1]
            for candidate in complete(text):
                yield Completion(candidate, start_position=-len(word))

    return PromptSession(
        history=_history(),
        completer=SlashCompleter(),
        complete_while_typing=False,
        color_depth=ColorDepth.MONOCHROME if no_color else None,
        input=input,
        output=output,
    )


class ChatApp:
    """The terminal side of a chat: reading, drawing replies, commands, saving the matrix."""

    def __init__(self, loaded, hot, session: ChatSession, console: Console, err: Console,
                 labels: TokenLabels | None = None, interrupts: Interrupts | None = None,
                 save_every: float = SAVE_EVERY_SECONDS) -> None:
        self.loaded = loaded
        self.hot = hot
        self.session = session
        self.console = console
        self.err = err
        self.labels = labels or TokenLabels(loaded.tokenizer)
        self.interrupts = interrupts or Interrupts()
        self.save_every = save_every
        self.last_save = time.monotonic()
        session.topics.setdefault("model", self.describe_model)
        session.topics.setdefault("matrix", self.describe_matrix)

    # -- matrix -----------------------------------------------------------------------------

    def save(self, final: bool = False) -> None:
        """Write the matrix back; a failure is a warning, never a lost conversation."""
        self.last_save = time.monotonic()
        try:
            rows = self.hot.save()
        except Exception as exc:  # noqa: BLE001 - any failure to save is only a warning
            self.err.print(Text(f"tr: warning: could not save the matrix to {self.hot.path}: {exc}", style="yellow"))
            return
        if rows and (final or self.session.settings.verbose):
            self.err.print(Text(f"matrix: {rows:,} rows saved to {self.hot.path}", style="dim"))

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
        return "\n".join([
            f"{loaded.model_id}",
            f"  {str(loaded.dtype).removeprefix('torch.')} on {loaded.device}, {params / 1e6:,.1f}M parameters, "
            f"vocabulary {loaded.vocab_size:,}, context {f'{context:,}' if context else 'unknown'} tokens",
            f"  draft {tree_summary(decoder)}: depth {tree.depth}, widths {'/'.join(map(str, tree.widths()))}; k = {decoder.k}",
            f"  chat template: {template}; {torch.get_num_threads()} CPU threads",
            f"  conversation: {len(self.session.messages)} messages, {len(decoder.tokens):,} tokens in the KV cache",
        ])

    def describe_matrix(self) -> str:
        hot = self.hot
        saving = f"saved at exit and every {self.save_every / 60:g} minutes" if hot.save_enabled else "not saved (--no-save)"
        return "\n".join([
            hot.describe(),
            f"  {rows_filled(hot.matrix):,} of {hot.matrix.shape[0]:,} rows filled, k = {hot.matrix.shape[1]}; {saving}",
        ])

    def banner(self) -> None:
        loaded, decoder = self.loaded, self.session.decoder
        self.err.print(Text(
            f"{loaded.model_id} · {str(loaded.dtype).removeprefix('torch.')} · {loaded.device} · "
            f"{tree_summary(decoder)} · {self.hot.describe()} · "
            f"{decoder.sampling.describe()}", style="dim"))
        if not self.session.templated:
            self.warn(f"{loaded.model_id} has no chat template: plain-completion mode (your text is continued as written)")

    def note(self, message: str) -> None:
        self.console.print(Text(message, style="dim"), soft_wrap=True)

    def warn(self, message: str) -> None:
        self.console.print(Text(message, style="yellow"), soft_wrap=True)

    # -- replies ----------------------------------------------------------------------------

    def stream(self, events: Iterable[StepEvent], live: bool) -> None:
        """Draw a reply as its events arrive; Ctrl-C stops it between steps."""
        text = IncrementalDecoder(self.loaded.tokenizer)
        with self.interrupts.deferred(), _no_echo(sys.stdin):
            if live:
                view = LiveView(self.console, self.labels, lambda: self.session.stats, self.session.settings.live)
                with view:
                    for event in events:
                        view.push(event, text.push(event.new_tokens))
            else:  # plain text; Console.out applies no markup, wrapping or highlighting
                last = "\n"
                for event in events:
                    delta = text.push(event.new_tokens)
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
            self.warn(f"tr: error while generating: {exc}; that message was dropped, the conversation goes on")

    def send(self, message: str) -> None:
        try:
            events = self.session.reply(message, stop_requested=self.interrupts.requested)
        except CommandError as exc:
            self.warn(str(exc))
            return
        self._generate(events)

    def retry(self) -> None:
        events = self.session.retry(stop_requested=self.interrupts.requested)
        self.note(f"retrying: {self.session.messages[-1]['content']}")
        self._generate(events)

    # -- commands ---------------------------------------------------------------------------

    def show_help(self) -> None:
        table = Table.grid(padding=(0, 2))
        for usage, what in help_lines():
            table.add_row(Text(usage, style="bold"), Text(what))
        self.console.print(table)
        self.note("Ctrl-C stops a reply; Ctrl-D or /bye leaves.")

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
            self.warn(str(exc))
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
        self.note('Type a message; """ starts a multi-line one. /help lists commands; Ctrl-D or /bye leaves.')
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
                    self.note("(Ctrl-C again to quit; Ctrl-D or /bye leaves)")
        except DoubleInterrupt:
            code = 130
            self.console.print()
        finally:
            self.save(final=True)
        return code

    def piped(self, messages: list[str]) -> int:
        """Not a terminal: each message in turn, replies as plain text on stdout, status on stderr."""
        self.banner()
        out = self.console.file
        try:
            for message in messages:
                try:
                    events = self.session.reply(message)
                except CommandError as exc:
                    raise UserError(str(exc)) from None
                text = IncrementalDecoder(self.loaded.tokenizer)
                for event in events:
                    out.write(text.push(event.new_tokens))
                    out.flush()
                out.write("\n")
                out.flush()
                self.err.print(stats_line(self.session.last.stats, self.session.settings.verbose))
        finally:
            self.save(final=True)
        return 0


def read_piped(stream, each_line: bool) -> list[str]:
    data = stream.read()
    if each_line:
        return [line.rstrip("\r") for line in data.split("\n") if line.strip()]
    data = data.rstrip("\r\n")
    return [data] if data.strip() else []


def _complete_live(incomplete: str) -> list[str]:
    return [m for m in LIVE_MODES if m.startswith(incomplete)]


def chat(
    model: str | None = ModelArg,
    system: str | None = typer.Option(None, "--system", help="System prompt of the conversation."),
    max_new_tokens: int = typer.Option(512, "--max-new-tokens", "-n", min=1, help="Longest reply, in tokens."),
    tree: str = TreeOpt,
    lookup: int | None = LookupOpt,
    k: int = KOpt,
    live: str = typer.Option("path", "--live", autocompletion=_complete_live,
                             help="Panel under the reply: path (accepted draft path of each step), tree (the whole draft tree), off (plain text)."),
    no_color: bool = typer.Option(False, "--no-color", help="No colors (also: the NO_COLOR environment variable)."),
    each_line: bool = typer.Option(False, "--each-line", help="Piped input: every line is the next message of one conversation."),
    temperature: float | None = TemperatureOpt,
    top_p: float | None = TopPOpt,
    top_k: int | None = TopKOpt,
    repetition_penalty: float | None = RepetitionPenaltyOpt,
    seed: int | None = SamplingSeedOpt,
    matrix: Path | None = MatrixPathOpt,
    cold: bool = ColdOpt,
    no_save: bool = NoSaveOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
) -> None:
    """Chat with a model: multi-turn from the KV cache, live view of each decode step, slash commands."""
    if no_color:
        common.stderr.no_color = True
    with user_errors():
        if live not in LIVE_MODES:
            raise fail(f"--live {live}: use one of {', '.join(LIVE_MODES)}")
        choice = tree_option(tree, k, lookup)
        request = sampling_request(temperature, top_p, top_k, repetition_penalty, seed)
        interactive = sys.stdin.isatty() and sys.stdout.isatty()
        messages: list[str] | None = None
        if not interactive:
            if sys.stdin.isatty():
                common.stderr.print(Text("reading one message until Ctrl-D (stdout is not a terminal)", style="dim"))
            messages = read_piped(sys.stdin, each_line)
            if not messages:
                raise fail("no message on stdin; pipe one in, or run tr chat in a terminal")

        loaded = load_with_progress(model, device, dtype)
        hot = open_matrix(loaded, k, matrix, cold, no_save)
        decoder = make_decoder(loaded, hot, choice, sampling=sampling_config(request, loaded))
        settings = Settings(max_new_tokens=max_new_tokens, live=live, temperature=temperature, top_p=top_p, top_k=top_k,
                            repetition_penalty=repetition_penalty, seed=seed)
        session = ChatSession(
            loaded.tokenizer, decoder, loaded.eos_token_ids, system=system, settings=settings,
            max_positions=context_limit(loaded.model), model_id=loaded.model_id,
        )
        no_color_flag = True if no_color else None  # None: Rich follows NO_COLOR
        err = Console(stderr=True, highlight=False, soft_wrap=True, no_color=no_color_flag)
        if messages is not None:
            out = Console(highlight=False, soft_wrap=True, no_color=True, force_terminal=False)
            code = ChatApp(loaded, hot, session, out, err).piped(messages)
        else:
            out = Console(highlight=False, no_color=no_color_flag)
            app = ChatApp(loaded, hot, session, out, err)
            code = app.repl(make_prompt_session(no_color=no_color or bool(os.environ.get("NO_COLOR"))))
    raise typer.Exit(code)
