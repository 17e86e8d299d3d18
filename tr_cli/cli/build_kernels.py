"""`python -m tr_cli.cli.build_kernels`: compile tr's kernels into the cache dir ahead of the first
start (`make install` runs it), with the build's progress on stderr; exit status 1 and one line
where they cannot run or build here."""

from __future__ import annotations

import sys

from ..models import native_kernels
from ..models.load import kernels_dir
from ..store.paths import cache_dir


def main() -> int:
    def say(message: str) -> None:
        print(f"{message}…", file=sys.stderr, flush=True)

    try:
        library = native_kernels.load(kernels_dir(cache_dir()), say)
    except native_kernels.KernelBuildError as exc:
        print(f"tr: {exc}", file=sys.stderr)
        return 1
    print(f"tr's kernels are ready: {library}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
