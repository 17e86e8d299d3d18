"""Run in a subprocess by tests/unit/cli/test_prompt_signals.py (a prompt that misses the signal
may wait for Enter on prompt-toolkit's own error page, or loop: the test bounds it in time and
memory from outside). The chat's prompt session reads a pipe where keys are typed; the signal
comes while a key is handled (its binding raises it), or once the app idles, sent to a helper
thread (as the kernel may choose one) or to the main thread. Prints `raised NAME SIGNAL` for what
the prompt raised, `read LINE` for a line it read after all (it gets Enter every half second
from UNSTICK_AFTER on), then `handler tr` when SIGTERM is tr's handler again after the prompt."""

import signal
import sys
import threading
import time

from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.output import DummyOutput

from tr_cli.cli.interrupts import Terminated, terminating_signals
from tr_cli.cli.prompt_session import make_prompt_session

UNSTICK_AFTER = 5.0
SIGNAL_KEY = b"\x14"  # Ctrl-T: its binding raises the signal while the loop handles the key


def main(sig: int, when: str) -> None:
    keys = b"half a" + SIGNAL_KEY + b" line" if when == "handling-a-key" else b"half a line"
    bindings = KeyBindings()
    bindings.add("c-t")(lambda event: signal.raise_signal(sig))
    main_thread, ended = threading.get_ident(), threading.Event()
    with create_pipe_input() as pipe, terminating_signals():
        tr_handler = signal.getsignal(signal.SIGTERM)
        session = make_prompt_session(input=pipe, output=DummyOutput())

        def send() -> None:
            pipe.send_bytes(keys)
            if when != "handling-a-key":
                time.sleep(0.5)  # the app has taken the keys and sits idle in its event loop
                signal.pthread_kill(threading.get_ident() if when == "idle-other-thread" else main_thread, sig)
            if ended.wait(UNSTICK_AFTER):
                return
            while not ended.is_set():
                try:
                    pipe.send_text("\r")
                except OSError:  # the prompt has ended and closed the pipe
                    return
                ended.wait(0.5)

        threading.Thread(target=send, daemon=True).start()
        try:
            line = session.prompt(">>> ", key_bindings=bindings)
            print("read", line, flush=True)
        except Terminated as exc:
            print("raised Terminated", signal.Signals(exc.signum).name, flush=True)
        except BaseException as exc:  # noqa: BLE001 - what the prompt raised is the result
            print("raised", type(exc).__name__, flush=True)
        finally:
            ended.set()
        if signal.getsignal(signal.SIGTERM) is tr_handler:
            print("handler tr", flush=True)


if __name__ == "__main__":
    main(signal.Signals[sys.argv[1]], sys.argv[2])
