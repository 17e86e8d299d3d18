"""The `tr chat` REPL driven as a person types, through prompt-toolkit's pipe input, on the tiny
random model: a two-turn conversation, every slash command, multi-line input, Ctrl-C at the
prompt and during generation (a real SIGINT), Ctrl-D and /bye (0), a double Ctrl-C (130), the
live panel, the input history file (and one warning, not a broken chat, when it cannot be used)."""

from __future__ import annotations

import io
import json
import os
import signal

import pytest
from rich.console import Console

from tr_cli.chat.session import ChatSession, Settings
from tr_cli.cli.chat_app import ChatApp
from tr_cli.cli.interrupts import Interrupts
from tr_cli.cli.prompt_session import make_prompt_session
from tr_cli.core import TokenRecyclingDecoder
from tr_cli.core.drafters import StoreLookupDrafter
from tr_cli.core.sampling_config import SamplingConfig
from tr_cli.engine.engine import Engine
from tr_cli.models import context_limit
from tr_cli.store.hot_matrix import HotMatrix
from tr_cli.store.paths import cache_dir, data_dir

CTRL_C, CTRL_D = "\x03", "\x04"


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    from tr_cli.models import Runtime, load_model

    return load_model(str(tiny_llama_dir), Runtime.resolve("cpu", "float32"), cache=cache_dir())


@pytest.fixture(autouse=True)
def sigint_raises():
    """Ctrl-C as in a terminal, even when the test run itself was started with SIGINT ignored
    (nohup, some CI runners): a process inherits SIG_IGN and these tests would see nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def fresh_home(home, monkeypatch):
    monkeypatch.delenv("TR_NOHISTORY", raising=False)


class Run:
    def __init__(self, code: int, out: str, err: str, app: ChatApp) -> None:
        self.code, self.out, self.err, self.app = code, out, err, app
        self.session = app.session


def make_app(
    loaded,
    live: str = "off",
    terminal: bool = False,
    max_new_tokens: int = 8,
    system: str | None = None,
    store: bool = False,
):
    hot = HotMatrix.open(loaded.tokenizer, loaded.vocab_size, loaded.model_id, k=8, device=loaded.runtime.device)
    decoder = TokenRecyclingDecoder(
        loaded.model, matrix=hot.matrix, drafters=[StoreLookupDrafter(hot.store)] if store else []
    )
    engine = Engine(loaded, SamplingConfig.greedy(), hot=hot, decoder=decoder)
    session = ChatSession(
        loaded.tokenizer,
        decoder,
        loaded.eos_token_ids,
        system=system,
        settings=Settings(max_new_tokens=max_new_tokens, live=live),
        max_positions=context_limit(loaded.model),
        model_id=loaded.model_id,
    )
    console = Console(
        file=io.StringIO(),
        width=100,
        height=30,
        record=True,
        force_terminal=terminal,
        color_system=None,
        highlight=False,
    )
    err = Console(file=io.StringIO(), width=200, record=True, color_system=None, highlight=False)
    return ChatApp(engine, session, console, err)


def repl(loaded, keys: str, app: ChatApp | None = None, **kwargs) -> Run:
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    app = app or make_app(loaded, **kwargs)
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        code = app.repl(make_prompt_session(input=pipe, output=DummyOutput(), err=app.err))
    return Run(code, app.console.export_text(), app.err.export_text(), app)


def test_two_turns_every_command_and_multiline(tiny, tmp_path):
    saved = tmp_path / "conversation.json"
    keys = "".join(
        line + "\r"
        for line in [
            "Hello there",
            "And then?",
            "/help",
            "/?",
            "/show settings",
            "/show model",
            "/show template",
            "/show matrix",
            "/show nothing",
            "/set max_new_tokens 6",
            "/set seed 9",
            "/set temperature 0.7",
            "/set top_p 0.9",
            "/set top_p 1.5",
            "/show settings",
            "/set live tree",
            "/set live off",
            "/set verbose",
            "/x",
            "/system Be [bold]brief[/].",
            "/system",
            f"/save {saved}",
            "/retry",
            '"""',
            "first line",
            "second line",
            '"""',
            "//slash message",
            "/clear",
            f"/load {saved}",
            "/load /nonexistent/file.json",
            "/bye",
        ]
    )
    run = repl(tiny, keys)
    assert run.code == 0
    out = run.out
    # Two turns, then a retry of the second, a multi-line message and a //-escaped one.
    assert out.count(" tok/s · MAT ") == 5
    assert "Unknown command /x — /help lists them" in out
    assert out.count("/clear          forget the conversation") == 2  # /help and /?
    assert "max_new_tokens  8" in out and "decoding        greedy" in out
    assert "draft tree paper (80 nodes): depth 6" in out and "<|im_start|>" in out and "rows filled" in out
    assert "usage: /show settings|model|template|matrix" in out
    assert "max_new_tokens = 6" in out and "live = tree" in out and "live = off" in out and "verbose = on" in out
    assert "seed = 9 (greedy)" in out
    assert "temperature = 0.7 (sampling: temperature 0.7, top_p 1, top_k 50, seed 9)" in out
    assert "top_p = 0.9 (sampling: temperature 0.7, top_p 0.9, top_k 50, seed 9)" in out
    assert "top_p must be between 0 and 1, got 1.5" in out
    assert "decoding        sampling: temperature 0.7, top_p 0.9, top_k 50, seed 9" in out
    assert run.session.decoder.sampler is not None  # the /retry and later replies were sampled
    assert "System prompt: Be [bold]brief[/]." in out
    assert "retrying: And then?" in out
    assert "per step: draft" in out  # verbose stats
    assert "Conversation cleared" in out
    assert f"Loaded 4 messages from {saved}" in out
    assert "cannot read /nonexistent/file.json" in out
    data = json.loads(saved.read_text())
    assert data["system"] == "Be [bold]brief[/]."
    assert [m["content"] for m in data["messages"] if m["role"] == "user"] == ["Hello there", "And then?"]
    # After /load the conversation is the saved one, waiting for the next message.
    assert run.session.messages == data["messages"]


def test_multiline_and_escaped_slash_are_messages(tiny):
    run = repl(tiny, '"""\rfirst line\r\rsecond line"""\r//etc/hosts is a file\r' + CTRL_D)
    assert run.code == 0
    users = [m["content"] for m in run.session.messages if m["role"] == "user"]
    assert users == ["first line\n\nsecond line", "/etc/hosts is a file"]
    replies = [m["content"] for m in run.session.messages if m["role"] == "assistant"]
    for reply in replies:
        assert reply.strip()[:20] in run.out


def test_ctrl_c_at_prompt_hints_and_ctrl_d_exits_0_saving_the_matrix(tiny, home):
    run = repl(tiny, "Hello there\r" + CTRL_C + CTRL_D)
    assert run.code == 0
    assert "(Ctrl-C again to quit; Ctrl-D or /bye leaves)" in run.out
    assert "rows saved to" in run.err
    assert run.app.hot.path.exists() and str(run.app.hot.path).startswith(str(home))


def test_double_ctrl_c_exits_130_saving(tiny):
    run = repl(tiny, "Hello there\r" + CTRL_C + CTRL_C + "never sent\r")
    assert run.code == 130
    assert "rows saved to" in run.err
    assert [m["content"] for m in run.session.messages if m["role"] == "user"] == ["Hello there"]


def test_ctrl_c_during_generation_stops_reply_and_next_prompt_works(tiny):
    app = make_app(tiny, max_new_tokens=60)
    original = app.session.reply
    calls = []

    def reply(text, stop_requested=None):
        events = original(text, stop_requested)
        calls.append(text)

        def interrupted():
            for n, event in enumerate(events):
                yield event
                if len(calls) == 1 and n == 1:
                    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as the terminal delivers it

        return interrupted()

    app.session.reply = reply
    run = repl(tiny, "Tell me a long story\r/set max_new_tokens 5\rGo on.\r/bye\r", app=app)
    assert run.code == 0
    assert "interrupted" in run.out
    first_reply = run.session.messages[1]["content"]
    assert 0 < len(run.session.tokenizer.encode(first_reply)) < 60
    assert [m["role"] for m in run.session.messages] == ["user", "assistant"] * 2
    assert run.out.count(" tok/s · MAT ") == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_interrupts_double_press_within_a_second():
    now = [100.0]
    interrupts = Interrupts(clock=lambda: now[0])
    assert not interrupts.hit()
    now[0] += 1.5
    assert not interrupts.hit()
    now[0] += 0.5
    assert interrupts.hit()
    with interrupts.deferred():
        now[0] += 5
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupts.requested()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_live_panel_in_a_terminal(tiny):
    run = repl(tiny, "Hello there\r/bye\r", live="path", terminal=True, max_new_tokens=12)
    assert run.code == 0
    reply = run.session.messages[1]["content"]
    assert "rejected:" in run.out and "accepted" in run.out and " tok/s · MAT " in run.out
    assert reply.split()[0] in run.out


def test_history_file_and_tr_nohistory(tiny, home, monkeypatch):
    repl(tiny, "/show settings\r/bye\r")
    history = data_dir() / "chat_history"
    assert history.is_file() and "/show settings" in history.read_text()
    history.unlink()
    monkeypatch.setenv("TR_NOHISTORY", "1")
    repl(tiny, "/show settings\r/bye\r")
    assert not history.exists()


def history_warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if "input history" in line]


@pytest.mark.parametrize("broken", ["directory", "data dir is a file"])
def test_unusable_history_file_is_one_warning_and_the_chat_goes_on(tiny, home, broken):
    history = data_dir() / "chat_history"
    if broken == "directory":
        history.mkdir(parents=True)
    else:
        data_dir().parent.mkdir(parents=True, exist_ok=True)
        data_dir().write_text("not a directory")
    run = repl(tiny, "Hello there\r/show settings\rAnd then?\r/bye\r")
    assert run.code == 0
    assert [m["role"] for m in run.session.messages] == ["user", "assistant"] * 2
    assert run.out.count(" tok/s · MAT ") == 2 and "max_new_tokens  8" in run.out
    [warning] = history_warnings(run.err)
    assert warning.startswith("tr: warning: input history off for this chat: ")
    assert str(history) in warning and "TR_NOHISTORY=1" in warning
    if broken == "directory":
        assert "is a directory; remove or rename it" in warning
        assert history.is_dir() and not any(history.iterdir())  # left as it was
    else:
        assert f"cannot be created ({data_dir()} is a file); move that file away" in warning
        assert data_dir().read_text() == "not a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes any file")
def test_unreadable_history_file_is_one_warning(tiny, home):
    history = data_dir() / "chat_history"
    history.parent.mkdir(parents=True)
    history.write_text("\n# old\n+secret\n")
    history.chmod(0o200)
    try:
        run = repl(tiny, "Hello there\r/bye\r")
    finally:
        history.chmod(0o600)
    assert run.code == 0 and [m["role"] for m in run.session.messages] == ["user", "assistant"]
    [warning] = history_warnings(run.err)
    assert f"{history} is not readable and writable by you; fix its permissions" in warning
    assert history.read_text() == "\n# old\n+secret\n"


def test_history_file_going_bad_mid_chat_is_one_warning(tiny, home):
    """The file worked at the start, then stops taking input (here: replaced by a directory while
    the first reply is generated): one warning after that input, later ones stay in memory."""
    app = make_app(tiny)
    history = data_dir() / "chat_history"
    original = app.session.reply

    def reply(text, stop_requested=None):
        if history.is_file():
            history.unlink()
            history.mkdir()
        return original(text, stop_requested)

    app.session.reply = reply
    run = repl(tiny, "Hello there\rAnd then?\r/show settings\r/bye\r", app=app)
    assert run.code == 0
    assert [m["role"] for m in run.session.messages] == ["user", "assistant"] * 2
    [warning] = history_warnings(run.err)
    assert f"{history} is a directory; remove or rename it" in warning
    assert run.err.count("tr: warning:") == 1


def test_context_full_at_the_prompt_suggests_clear_and_the_chat_goes_on(tiny):
    app = make_app(tiny, max_new_tokens=50)
    app.session.max_positions = 96  # as a model with max_position_embeddings 96 gives it
    run = repl(tiny, "Hello there\rAnd then?\rMore\r/clear\rAgain\r/bye\r", app=app)
    assert run.code == 0
    assert "the conversation fills the model's context (96 tokens); /clear starts a new one" in run.out
    assert "Conversation cleared" in run.out
    assert [m["content"] for m in run.session.messages if m["role"] == "user"] == ["Again"]
    assert run.session.messages[-1]["role"] == "assistant"


def test_context_full_in_piped_mode_advises_the_next_run_not_clear(tiny):
    """The same rule as at the prompt (ChatSession), in piped mode's words: no /clear there."""
    from tr_cli.chat.errors import ContextFull

    app = make_app(tiny, max_new_tokens=50)
    app.session.max_positions = 96
    with pytest.raises(ContextFull) as full:
        app.piped(["Hello there", "And then?", "More", "never reached"])
    message = str(full.value)
    assert "/clear" not in message
    assert message.startswith("the conversation fills the model's context (96 tokens) after ")
    assert "pipe fewer --each-line messages per run" in message and "lower --max-new-tokens" in message
    answered = [m["content"] for m in app.session.messages if m["role"] == "assistant"]
    assert answered and app.console.file.getvalue() == "".join(reply + "\n" for reply in answered)
    assert "rows saved to" in app.err.export_text()  # the matrix is still saved


def test_bracketed_paste_is_one_message(tiny):
    run = repl(tiny, "\x1b[200~pasted line one\npasted line two\x1b[201~\r/bye\r")
    assert run.code == 0
    assert run.session.messages[0]["content"] == "pasted line one\npasted line two"


def test_tab_completion_of_the_prompt_session():
    from prompt_toolkit.completion import CompleteEvent
    from prompt_toolkit.document import Document
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    with create_pipe_input() as pipe:
        completer = make_prompt_session(input=pipe, output=DummyOutput()).completer

    def complete(text: str) -> list[tuple[str, int]]:
        found = completer.get_completions(Document(text), CompleteEvent(completion_requested=True))
        return [(c.text, c.start_position) for c in found]

    assert complete("/sho") == [("/show", -4)]
    assert complete("/show te") == [("template", -2)]
    assert complete("/set live ") == [("path", 0), ("tree", 0), ("off", 0)]
    assert complete("hello /sh") == []


def test_matrix_save_failure_is_a_warning(tiny, monkeypatch):
    app = make_app(tiny)

    def broken_save():
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(app.hot, "save", broken_save)
    run = repl(tiny, "Hello there\r" + CTRL_D, app=app)
    assert run.code == 0
    assert "warning: could not save the matrix" in run.err and "No space left on device" in run.err
    assert [m["role"] for m in run.session.messages] == ["user", "assistant"]


def test_periodic_matrix_save(tiny):
    app = make_app(tiny)
    app.save_every = 0.0  # "every few minutes", here after every reply
    saves = []
    original = app.hot.save
    app.hot.save = lambda: saves.append(1) or original()
    repl(tiny, "Hello there\rAnd then?\r/bye\r", app=app)
    assert len(saves) == 3  # after each reply and at exit


def test_the_conversation_joins_the_store_when_the_chat_ends(tiny):
    """Periodic saves keep the conversation going (its KV cache, one document); the final save
    adds it to the recycled store, both turns as one conversation."""
    from tr_cli.store.recycled_file import read_recycled_store, recycled_store_path

    app = make_app(tiny, store=True)
    app.save_every = 0.0
    tokens_seen = []
    original = app.hot.save
    app.hot.save = lambda: tokens_seen.append(list(app.session.decoder.tokens)) or original()
    repl(tiny, "Hello there\rAnd then?\r/bye\r", app=app)
    after_first, after_second, at_exit = tokens_seen
    assert after_first and after_second[: len(after_first)] == after_first  # the cache went on
    assert at_exit == []  # the conversation ended before the final save
    # One new conversation after whatever the store started with (the starter's, for this tokenizer).
    started = len(app.hot.store.documents) - 1
    docs = read_recycled_store(recycled_store_path(app.hot.path)).documents
    assert len(docs) == started + 1 and docs[-1].tokens.tolist() == after_second


def test_an_error_while_generating_does_not_end_the_chat(tiny):
    app = make_app(tiny)
    original = app.session.decoder.steps
    failures = [1]

    def steps(input_ids, stop, *rest):
        for n, event in enumerate(original(input_ids, stop, *rest)):
            if n == 2 and failures:
                failures.pop()
                raise RuntimeError("out of memory (simulated)")
            yield event

    app.session.decoder.steps = steps
    run = repl(tiny, "Hello there\rHello again\r/bye\r", app=app)
    assert run.code == 0
    assert "error while generating: out of memory (simulated)" in run.out
    assert [m["content"] for m in run.session.messages if m["role"] == "user"] == ["Hello again"]
    assert run.session.last.rebuilt and run.out.count(" tok/s · MAT ") == 1
