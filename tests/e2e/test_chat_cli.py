"""`tr chat` as a process: piped mode (stdout is exactly the model's greedy reply, status on stderr),
--each-line conversations, one-line errors, and a real terminal (a pty): two turns, the live panel,
Ctrl-C during generation (the process keeps going, the next prompt works), Ctrl-D exits 0, a double
Ctrl-C exits 130, --no-color / NO_COLOR, a model without a chat template."""

from __future__ import annotations

import codecs
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from e2e.test_fault_injection import default_signals

from tr_cli.chat.session import ChatSession, Settings
from tr_cli.core import TokenRecyclingDecoder
from tr_cli.core.sampling_config import SamplingRequest
from tr_cli.models import context_limit
from tr_cli.store.paths import cache_dir
from tr_cli.text.conversation import encode_prompt

BIN = Path(sys.executable).parent
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78DEM]|\r")
COLOR_SGR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-79]|4[0-79]|9[0-7]|10[0-7]|38;|48;)[0-9;]*m")
STATS = " tok/s · MAT "


def chat_command() -> list[str]:
    return [str(BIN / "tr"), "chat"]


def environment(home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TR_NOHISTORY", "FORCE_COLOR")}
    return {**env, "HF_HUB_OFFLINE": "1", "TR_HOME": str(home), "COLUMNS": "120", "PROMPT_TOOLKIT_NO_CPR": "1", **extra}


def run_piped(args: list[str], stdin: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*chat_command(), *args], input=stdin, capture_output=True, text=True, env=environment(home), timeout=600
    )


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    from tr_cli.models import Runtime, load_model

    return load_model(str(tiny_llama_dir), Runtime.resolve("cpu", "float32"), cache=cache_dir())


@pytest.mark.parametrize(
    "prompt, budget",
    [
        ("What is the capital of France?", 5),
        # A budget that cuts an emoji in two: its bytes used to hold back the whole reply (issue 15).
        ("Reply with three emoji: 🔥🚀🌊", 16),
    ],
)
def test_piped_reply_is_the_greedy_output(smollm2_fp32, smollm2_checkpoint, tmp_path, prompt, budget):
    # --tree paper: the reply is generate's whatever the tree; a designed one would measure t(N) first.
    args = [str(smollm2_checkpoint), "--dtype", "float32", "--tree", "paper", "-n", str(budget)]
    out = run_piped(args, prompt + "\n", tmp_path)
    assert out.returncode == 0, out.stderr
    ids = encode_prompt(smollm2_fp32.tokenizer, prompt)
    with torch.inference_mode():
        full = smollm2_fp32.model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=budget,
            do_sample=False,
            pad_token_id=2,
        )
    expected = smollm2_fp32.tokenizer.decode(full[0, len(ids) :], skip_special_tokens=True)
    assert expected.strip()
    assert out.stdout == expected + "\n"
    assert STATS in out.stderr and "rows saved to" in out.stderr
    assert "\x1b" not in out.stdout + out.stderr


def replies(session: ChatSession, messages: tuple[str, ...]) -> str:
    """What piped `tr chat --each-line` prints for these messages, computed in-process."""
    out = ""
    for message in messages:
        for _ in session.reply(message):
            pass
        out += session.last.text + "\n"
    return out


def test_each_line_is_one_conversation(tiny, tiny_llama_dir, tmp_path):
    out = run_piped(
        [str(tiny_llama_dir), "--dtype", "float32", "-n", "8", "--each-line"], "Hello there\n\nAnd then?\n", tmp_path
    )
    assert out.returncode == 0, out.stderr
    session = ChatSession(
        tiny.tokenizer,
        TokenRecyclingDecoder(tiny.model),
        tiny.eos_token_ids,
        settings=Settings(max_new_tokens=8),
        max_positions=context_limit(tiny.model),
    )
    expected = replies(session, ("Hello there", "And then?"))
    assert out.stdout == expected
    assert out.stderr.count(STATS) == 2


def test_sampled_piped_chat_is_reproducible_from_its_seed(tiny, tiny_llama_dir, tmp_path):
    """--temperature/--top-p/--seed: the replies are the ones a session with the same settings
    samples in-process (another matrix, so other drafts: a seeded run does not depend on them)."""
    args = [
        str(tiny_llama_dir),
        "--dtype",
        "float32",
        "-n",
        "8",
        "--each-line",
        "--temperature",
        "0.9",
        "--top-p",
        "0.95",
        "--seed",
        "4",
    ]
    out = run_piped(args, "Hello there\nAnd then?\n", tmp_path)
    assert out.returncode == 0, out.stderr
    assert "sampling: temperature 0.9, top_p 0.95, top_k 50, seed 4" in out.stderr
    settings = Settings(max_new_tokens=8, sampling=SamplingRequest(temperature=0.9, top_p=0.95, seed=4))
    session = ChatSession(
        tiny.tokenizer,
        TokenRecyclingDecoder(tiny.model, sampling=settings.sampling_config(tiny.model.generation_config)),
        tiny.eos_token_ids,
        settings=settings,
        max_positions=context_limit(tiny.model),
    )
    expected = replies(session, ("Hello there", "And then?"))
    assert out.stdout == expected


@pytest.mark.parametrize(
    "args, stdin, message",
    [
        ([], "", "no message on stdin"),
        (["--live", "fancy"], "hi", "--live fancy: use one of path, tree, off"),
        (["--temperature", "-1"], "hi", "--temperature -1.0: must be 0 (greedy) or more"),
        (["--top-p", "2"], "hi", "--top-p 2.0: must be between 0 and 1"),
        (
            ["--temperature", "0", "--top-k", "5"],
            "hi",
            "--top-k 5: needs sampling, but temperature 0 is greedy decoding",
        ),
    ],
)
def test_one_line_errors(args, stdin, message, tmp_path):
    out = run_piped(args, stdin, tmp_path)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [f"tr: error: {out.stderr.strip().removeprefix('tr: error: ')}"]
    assert message in out.stderr


@pytest.mark.parametrize("stdin", [b"caf\xe9", None])
def test_stdin_that_is_not_text_or_closed_is_one_line(stdin, tmp_path):
    """Bytes that are not UTF-8 used to reach the tokenizer; a closed stdin, `sys.stdin.isatty()`."""
    command = " ".join([*chat_command(), "<&-" if stdin is None else ""])
    out = subprocess.run(command, shell=True, input=stdin, capture_output=True, env=environment(tmp_path), timeout=600)
    expected = "byte 0xe9 at character 4 is not valid UTF-8" if stdin else "standard input is closed"
    assert out.returncode == 1 and out.stderr.decode().strip().splitlines() == [
        f"tr: error: tr chat: {expected}; " + ("give UTF-8 text" if stdin else "pipe the text in")
    ]


@pytest.mark.parametrize(
    "args, stdin, advice",
    [
        (
            [],
            "word " * 120,
            "the message from stdin leaves no room for a reply in the model's context (96 tokens); "
            "pipe in a shorter one",
        ),
        (
            ["--each-line", "-n", "30"],
            "Hello there\nAnd then?\nMore\nMore again\n",
            "the conversation fills the model's context (96 tokens) after {answered} messages; pipe fewer --each-line "
            "messages per run (each run starts a new conversation), or lower --max-new-tokens for shorter replies",
        ),
    ],
)
def test_piped_context_full_advises_the_next_run(small_context_model, tmp_path, args, stdin, advice):
    """Piped chat has no /clear: running out of context says what to pipe differently."""
    model = small_context_model(96)
    out = run_piped([str(model), "--dtype", "float32", "--tree", "paper", *args], stdin, tmp_path / "home")
    assert out.returncode == 1
    answered = out.stderr.count(STATS)  # the replies before it were printed
    assert out.stdout.count("\n") == answered and (answered > 0) == ("--each-line" in args)
    errors = [line for line in out.stderr.splitlines() if line.startswith("tr: error:")]
    assert errors == [f"tr: error: {advice.format(answered=answered)}"]
    assert "/clear" not in out.stderr


# -- a real terminal ---------------------------------------------------------------------------

# Make the pty the controlling terminal of the new session, so Ctrl-C (\x03) becomes SIGINT.
_CTTY = "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execvp(sys.argv[1], sys.argv[1:])"


class Terminal:
    def __init__(self, args: list[str], env: dict, rows: int = 40, cols: int = 120) -> None:
        import fcntl
        import termios

        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CTTY, *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**env, "TERM": "xterm-256color", "LINES": str(rows), "COLUMNS": str(cols)},
            start_new_session=True,
            close_fds=True,
            # A test run started in the background (`cmd &`, nohup) passes SIGINT on ignored: the
            # chat would never see Ctrl-C.
            preexec_fn=default_signals,
        )
        os.close(slave)
        self.fd = master
        self.raw = b""
        self.text = ""  # what was written, escape sequences removed (kept up to date by _read)
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._held = ""  # an escape sequence cut by the end of a read

    def _read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return
        try:
            data = os.read(self.fd, 1 << 20)
        except OSError:  # EIO once the child is gone
            time.sleep(timeout)
            return
        self.raw += data
        pending = self._held + self._decoder.decode(data)
        cut = pending.rfind("\x1b")
        if cut != -1 and not ANSI.match(pending, cut) and len(pending) - cut < 32:
            pending, self._held = pending[:cut], pending[cut:]
        else:
            self._held = ""
        self.text += ANSI.sub("", pending)

    def expect(self, condition, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition(self.text):
            if time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"timed out waiting for {what}; the terminal shows:\n{self.text[-3000:]}")
            self._read(0.05)

    def expect_text(self, needle: str, count: int = 1, timeout: float = 120) -> None:
        self.expect(lambda text: text.count(needle) >= count, f"{needle!r} x{count}", timeout)

    def ready(self) -> None:
        """Wait until the prompt is drawn and idle (keys sent earlier could be lost to a Ctrl-C)."""
        self.expect(lambda text: text.rstrip().endswith(">>>"), "the prompt")

    def ask(self, keys: str, then: str, count: int = 1) -> None:
        """At the prompt, type keys; wait for `then` to show (count times in all), then the prompt."""
        self.ready()
        self.send(keys)
        self.expect_text(then, count)
        self.ready()

    def send(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def wait(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.05)
        self._read(0.1)
        code = self.proc.wait(timeout=5)
        os.close(self.fd)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


needs_pty = pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pty")


@needs_pty
def test_terminal_session_ctrl_c_during_generation_and_ctrl_d(tiny_llama_dir, tmp_path):
    term = Terminal(
        [*chat_command(), str(tiny_llama_dir), "--dtype", "float32", "-n", "8", "--no-color"], environment(tmp_path)
    )
    try:
        term.ready()
        term.send("Hello there\r")
        term.expect_text("rejected:")  # the live panel, while generating
        term.expect_text(STATS, 1)
        term.ask("And then?\r", STATS, 2)
        term.ask("/set max_new_tokens 1500\r", "max_new_tokens = 1500")
        term.send("Tell me everything.\r")
        term.expect(lambda text: "rejected:" in text.partition("Tell me everything.")[2], "the reply streaming")
        term.send("\x03")
        term.expect_text("interrupted")
        term.ready()
        assert term.proc.poll() is None  # Ctrl-C stopped the reply, not the program
        term.ask("/set max_new_tokens 4\r", "max_new_tokens = 4")
        term.ask("Thanks!\r", STATS, 4)
        term.send("\x04")
        assert term.wait() == 0
    finally:
        term.close()
    assert "rows saved to" in term.text
    assert not COLOR_SGR.search(term.raw.decode("utf-8", "replace"))  # --no-color
    history = (tmp_path / "data" / "chat_history").read_text()
    for line in ("Hello there", "And then?", "/set max_new_tokens 1500", "Thanks!"):
        assert line in history


@needs_pty
def test_terminal_plain_completion_model_and_double_ctrl_c(tiny_llama_dir, tmp_path):
    plain = tmp_path / "no-template"
    shutil.copytree(tiny_llama_dir, plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    term = Terminal(
        [*chat_command(), str(plain), "--dtype", "float32", "-n", "6", "--live", "off"],
        environment(tmp_path / "home", NO_COLOR="1", TR_NOHISTORY="1"),
    )
    try:
        term.expect_text("no chat template: plain-completion mode")
        term.ask("Once upon a time\r", STATS)
        term.send("\x03\x03")
        assert term.wait() == 130
    finally:
        term.close()
    assert "rows saved to" in term.text
    assert not COLOR_SGR.search(term.raw.decode("utf-8", "replace"))  # NO_COLOR
    assert not (tmp_path / "home" / "data" / "chat_history").exists()  # TR_NOHISTORY


@needs_pty
def test_terminal_with_a_directory_as_history_file_warns_once_and_chats(tiny_llama_dir, tmp_path):
    history = tmp_path / "data" / "chat_history"
    history.mkdir(parents=True)
    term = Terminal(
        [*chat_command(), str(tiny_llama_dir), "--dtype", "float32", "-n", "6", "--live", "off", "--tree", "paper"],
        environment(tmp_path),
    )
    try:
        term.ask("Hello there\r", STATS)
        term.ask("And then?\r", STATS, 2)
        term.send("\x04")
        assert term.wait() == 0
    finally:
        term.close()
    warnings = [line.strip() for line in term.text.splitlines() if "tr: warning:" in line]
    assert warnings == [
        f"tr: warning: input history off for this chat: {history} is a directory; remove or rename it, "
        "or set TR_NOHISTORY=1 to go without"
    ]
    assert "Traceback" not in term.text and "Press ENTER" not in term.text
    assert history.is_dir() and not any(history.iterdir())


def test_piped_chat_into_a_full_device_is_one_line_and_saves(tiny_llama_dir, tmp_path):
    """stdout on /dev/full used to end in "unexpected OSError"; a closed pipe in "unexpected
    BrokenPipeError". What the run learned is saved either way."""
    args = [*chat_command(), str(tiny_llama_dir), "--dtype", "float32", "--tree", "paper", "-n", "8"]
    with open("/dev/full", "w") as full:
        out = subprocess.run(
            args, input="Hello there", stdout=full, stderr=subprocess.PIPE, text=True, env=environment(tmp_path)
        )
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "tr: error: cannot write to standard output (No space left on device)"
    assert re.search(r"matrix: [\d,]+ rows saved to", out.stderr) and "Exception ignored" not in out.stderr
