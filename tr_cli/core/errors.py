"""The root of tr's errors, and the errors the decoding core raises.

Every error tr expects to meet (bad input, an unusable file, a model it cannot decode) derives
from TrError and carries a message that reads as one line: what is wrong and what to do. The
command line prints that line and exits; nothing else turns an error into output. Messages from
the core name no command-line flags: the core does not know how it was called.
"""

from __future__ import annotations


class TrError(Exception):
    """A problem tr reports as one line (what went wrong, what to do), never as a traceback."""


class UnsupportedAttention(TrError, ValueError):
    """The model uses an attention pattern the decoder cannot mask (e.g. chunked attention)."""


class InvalidTree(TrError, ValueError):
    """A draft tree that is not valid: malformed spec, unknown preset, unreadable file."""


class SettingError(TrError, ValueError):
    """A setting's value tr cannot use. It names the setting (`top_p`, `device`, `weights`), never
    how it was given: the command line words it as a flag, a chat's /set as a key, the server as
    a request field."""

    def __init__(self, setting: str, value: object, reason: str) -> None:
        self.setting = setting
        self.value = value
        self.reason = reason
        super().__init__(f"{setting} {value}: {reason}")


class PrefillStopped(Exception):
    """The caller asked the decode to stop while the prompt was still being read (between two
    prefill chunks). The conversation ends at the last token whose keys and values were cached,
    so a later request that starts with the same prompt reads only the rest."""

    def __init__(self, read: int, total: int) -> None:
        super().__init__(f"stopped after reading {read} of {total} prompt tokens")
        self.read = read
        self.total = total
