"""`tr matrix init | inspect | export | import | list`: manage the matrix files in the data dir and
the recycled stores kept beside them (`<matrix stem>.store.safetensors`). Arguments in, store
calls (tr_cli/store/: matrix_pair.py, transfer.py), lines out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NamedTuple

import typer
from rich.console import Console
from rich.progress import TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from ..core.matrix_width import DEFAULT_K
from ..core.wording import counted
from ..engine.options import DecodingOptions
from ..errors import MatrixFileError, StoreFileError, UserError
from ..store.paths import cache_dir
from ..store.remedies import Remedy
from ..store.timestamps import iso
from ..text.corpus import CorpusError, CorpusText, read_corpus, token_lists
from . import options as opt
from .completion import complete_matrix
from .console import progress_bar, stderr
from .store_errors import flag_words

if TYPE_CHECKING:  # the matrix files are torch tensors: loaded when a subcommand runs, not for --help
    from ..store.matrix_file import MatrixFile, MatrixOwner

Sources = Annotated[
    list[Path], typer.Option("--from", help="Text files or prompt JSONL files (default: the bundled sample prompts).")
]
Force = Annotated[bool, typer.Option("--force", help="Overwrite an existing matrix and its store.")]
MatrixTarget = Annotated[
    Path | None, typer.Option("--matrix", help="Write this file instead of the model's stored matrix.")
]
InspectTarget = Annotated[
    str | None,
    typer.Argument(
        help="A matrix file, or a model whose stored matrix to show (default model if omitted).",
        autocompletion=complete_matrix,
    ),
]
TokenizerModel = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="The model whose stored matrix to show (as TARGET), or whose tokenizer decodes --token when TARGET "
        "is a file.",
        autocompletion=opt.complete_models,
    ),
]
Tokens = Annotated[
    list[str], typer.Option("--token", help="Show the candidates stored for this text's tokens (repeatable).")
]
AsJson = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
ModelAndOutput = Annotated[
    list[str], typer.Argument(metavar="[MODEL] OUTPUT", help="Optional model, then the file to write.")
]
ModelAndInput = Annotated[
    list[str], typer.Argument(metavar="[MODEL] INPUT", help="Optional model, then the matrix file to import.")
]

app = typer.Typer(
    help="Manage the hot-start matrices (one per tokenizer, kept across sessions).",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help, as the main app's
)
stdout = Console(highlight=False, soft_wrap=True)


class ModelMatrix(NamedTuple):
    tokenizer: object
    owner: MatrixOwner


def _model_matrix(model: str | None, k: int) -> ModelMatrix:
    """A model's tokenizer and the matrix file it owns in the data dir."""
    from ..models import load_tokenizer
    from ..store.matrix_file import MatrixOwner

    tokenizer, vocab_size, source = load_tokenizer(model, cache=cache_dir())
    return ModelMatrix(tokenizer, MatrixOwner.of(tokenizer, vocab_size, k, source.model_id))


def _read(path: Path, what: str) -> MatrixFile:
    from ..store.matrix_file import read_matrix

    try:
        return read_matrix(path)
    except MatrixFileError as exc:
        raise MatrixFileError(f"{exc}; {what}") from None


def _read_corpus(sources: list[Path]) -> list[CorpusText]:
    try:
        return read_corpus(sources)
    except CorpusError as exc:
        raise UserError(f"--from {exc.path}: {exc.reason}" if exc.path else f"--from: {exc.reason}") from None


@app.command()
def init(
    model: opt.ModelArgument = None,
    sources: Sources = [],  # noqa: B006 - Typer's way of declaring a repeatable option
    force: Force = False,
    k: opt.K = DEFAULT_K,
    matrix: MatrixTarget = None,
    device: opt.Device = "auto",
    dtype: opt.Dtype = "auto",
    model_flag: opt.ModelFlag = None,
) -> None:
    """Build a matrix by running the model over text (prefill; each position's top-k into its token's row),
    and its recycled store from the same text (each text block or prompt one document)."""
    from ..core.matrix import new_matrix
    from ..core.matrix_init import fill_from_token_lists
    from ..store.matrix_file import MatrixOwner
    from ..store.matrix_pair import check_rebuild, write_built_matrix, write_corpus_recycled_store
    from .setup import open_engine

    model = opt.one_model(model, model_flag)
    texts = _read_corpus(sources)  # validated before the model loads
    options = DecodingOptions.parse(model=model, device=device, dtype=dtype, k=k)
    loaded = open_engine(options, matrix=False, decoder=False, banner=False).loaded
    owner = MatrixOwner.of(loaded.tokenizer, loaded.vocab_size, k, loaded.model_id)
    path = matrix or owner.default_path
    with flag_words():
        check_rebuild(path, overwrite=force)
    ids = token_lists(loaded.tokenizer, texts)
    live = new_matrix(loaded.vocab_size, k, loaded.runtime.device)
    total = sum(len(chunk) for chunk in ids)
    with progress_bar(TimeRemainingColumn()) as progress:
        task = progress.add_task(f"Prefilling {counted(len(texts), 'text')}", total=total)
        fill_from_token_lists(loaded.model, live, ids, progress=lambda n: progress.advance(task, n))
    data = write_built_matrix(path, live, owner)
    stderr.print(
        Text(f"matrix: {data.rows_filled:,} of {loaded.vocab_size:,} rows filled from {total:,} tokens → {path}")
    )
    target, recycled = write_corpus_recycled_store(path, ids, owner)
    texts_stored = counted(len(recycled.documents), "text")
    stderr.print(Text(f"recycled store: {texts_stored} ({recycled.total_tokens:,} tokens) → {target}"))


@app.command()
def inspect(
    target: InspectTarget = None,
    model: TokenizerModel = None,
    tokens: Tokens = [],  # noqa: B006 - Typer's way of declaring a repeatable option
    as_json: AsJson = False,
    k: opt.K = DEFAULT_K,
) -> None:
    """Show a matrix: where, how big, whose, how full, and the candidates for given tokens."""
    from ..models import load_tokenizer
    from ..store.hot_matrix import starter_matrix
    from ..store.matrix_file import SUFFIX, check_compatible, tokenizer_fingerprint
    from ..store.matrix_pair import is_recycled_store_name, matrix_path_of
    from ..store.recycled_file import recycled_store_path

    tokenizer = starter = None
    if target and is_recycled_store_name(target):
        raise UserError(f"{target}: a recycled store; pass the matrix beside it ({matrix_path_of(target)})")
    if target and (target.endswith(SUFFIX) or Path(target).is_file()):
        path = Path(target)
        store = recycled_store_path(path)
        data = _read(path, "pass a matrix file written by tr")
        if tokens:
            if model is None:
                raise UserError("--token needs --model MODEL to turn text into token ids for a matrix file")
            tokenizer, vocab_size, _ = load_tokenizer(model, cache=cache_dir())
            fingerprint = tokenizer_fingerprint(tokenizer)
            with flag_words():
                check_compatible(data.meta, fingerprint, vocab_size, data.meta.k, path, (Remedy.MATRIX_MODEL,))
    else:
        target = opt.one_model(target, model)
        tokenizer, owner = _model_matrix(target, k)
        path = owner.default_path
        store = recycled_store_path(path)
        if path.exists():
            data = _read(path, "move it away or rebuild it with tr matrix init --force")
        else:
            # What HotMatrix.open does on a fresh home: show what the next run will really use.
            starter = starter_matrix(path)
            if starter is None:
                build = f"tr matrix init {target or model or ''}".rstrip() + (f" --k {k}" if k != DEFAULT_K else "")
                raise UserError(f"no stored matrix for {owner.model_id} yet ({path}); build one with: {build}")
            stderr.print(
                Text(
                    f"no stored matrix for {owner.model_id} yet: the next run starts from the starter matrix "
                    f"shipped with tr (below) and saves what it learns to {path}"
                )
            )
            path, data = starter, _read(starter, "the starter files shipped with tr are damaged; reinstall tr")
            store = store if store.exists() else recycled_store_path(starter)
    report = _report(path, data)
    report["starter"] = starter is not None
    report["store"] = _recycled_store_report(store)
    if tokens:
        report["tokens"] = _token_candidates(tokenizer, data, tokens)
    if as_json:
        typer.echo(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        _print_report(report)


def _report(path: Path, data: MatrixFile) -> dict:
    meta = data.meta
    return {
        "path": str(path.resolve()),
        "shape": [meta.vocab_size, meta.k],
        "bytes": path.stat().st_size,
        "fingerprint": meta.fingerprint,
        "model": meta.model_id,
        "update_count": meta.update_count,
        "created": iso(meta.created_us),
        "updated": iso(meta.updated_us),
        "rows_filled": data.rows_filled,
        "rows_filled_percent": round(100.0 * data.rows_filled / meta.vocab_size, 2),
        "format_version": meta.format_version,
        "tr_version": meta.tr_version,
    }


def _recycled_store_report(path: Path) -> dict | None:
    """The recycled store beside a matrix: None when there is none, its error when unreadable."""
    from ..store.recycled_file import read_recycled_store

    if not path.exists():
        return None
    try:
        data = read_recycled_store(path)
    except StoreFileError as exc:
        return {"path": str(path.resolve()), "error": str(exc)}
    stamps = [doc.stamp for doc in data.documents]
    return {
        "path": str(path.resolve()),
        "documents": len(data.documents),
        "tokens": data.total_tokens,
        "capacity": data.meta.capacity,
        "bytes": path.stat().st_size,
        "oldest": iso(min(stamps)) if stamps else None,
        "newest": iso(max(stamps)) if stamps else None,
    }


def _describe_recycled_store(report: dict | None) -> str:
    if report is None:
        return "none"
    if "error" in report:
        return f"unreadable: {report['error']}"
    text = (
        f"{report['documents']:,} conversations, {report['tokens']:,} of {report['capacity']:,} tokens, "
        f"{_size(report['bytes'])}"
    )
    if report["documents"]:
        text += f", {report['oldest']} to {report['newest']}"
    return text


def _token_candidates(tokenizer, data: MatrixFile, texts: list[str]) -> list[dict]:
    out = []
    for text in texts:
        for token_id in tokenizer.encode(text, add_special_tokens=False):
            row = data.matrix[token_id].tolist()
            out.append(
                {
                    "text": text,
                    "token_id": token_id,
                    "token": tokenizer.decode([token_id]),
                    "filled": any(row),
                    "candidates": [{"id": c, "text": tokenizer.decode([c])} for c in row],
                }
            )
    return out


def _print_report(report: dict) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    rows = [
        ("path", report["path"]),
        ("shape", f"{report['shape'][0]:,} × {report['shape'][1]} (int32)"),
        ("size", f"{report['bytes'] / 1e6:.2f} MB"),
        ("fingerprint", report["fingerprint"]),
        ("model", report["model"]),
        ("updates", f"{report['update_count']:,} row updates"),
        ("created", report["created"]),
        ("updated", report["updated"]),
        ("rows filled", f"{report['rows_filled']:,} ({report['rows_filled_percent']:.2f} %)"),
        ("format", f"v{report['format_version']} (written by tr {report['tr_version']})"),
        ("store", _describe_recycled_store(report["store"])),
    ]
    for key, value in rows:
        table.add_row(key, Text(str(value)))
    stdout.print(table)
    if report.get("tokens"):
        tokens = Table(title="candidates (best first)", title_justify="left")
        tokens.add_column("token")
        tokens.add_column("id", justify="right")
        tokens.add_column("candidates")
        for entry in report["tokens"]:
            cands = " · ".join(repr(c["text"]) for c in entry["candidates"]) if entry["filled"] else "(empty row)"
            tokens.add_row(Text(repr(entry["token"])), str(entry["token_id"]), Text(cands))
        stdout.print(tokens)


@app.command()
def export(
    model_or_output: ModelAndOutput,
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUTPUT (and its store) if they exist.")] = False,
    k: opt.K = DEFAULT_K,
    model_flag: opt.ModelFlag = None,
) -> None:
    """Copy a model's stored matrix to a file (to move it to another machine), and its recycled
    store beside it (OUTPUT's stem + .store.safetensors) when there is one."""
    from ..store.transfer import check_export_target, export_pair

    model, output = _model_and_file(model_or_output, "OUTPUT", model_flag)
    output = Path(output)
    with flag_words():
        check_export_target(output, overwrite=force)
    path = _model_matrix(model, k).owner.default_path
    if not path.exists():
        raise UserError(f"no stored matrix for {model or 'the default model'} yet ({path}); nothing to export")
    with flag_words():
        exported = export_pair(path, output)
    recycled = exported.recycled_store
    extra = (
        f" + store of {len(recycled.documents):,} conversations → {exported.recycled_store_path}" if recycled else ""
    )
    stderr.print(Text(f"exported {path.name} ({exported.matrix.rows_filled:,} rows filled) → {output}{extra}"))


@app.command(name="import")
def import_(
    model_or_input: ModelAndInput,
    replace: Annotated[
        bool, typer.Option("--replace", help="Replace the stored matrix (and store, if INPUT has one) with INPUT.")
    ] = False,
    merge: Annotated[
        bool,
        typer.Option(
            "--merge",
            help="Per row, keep the more recently updated candidates; add the store's new conversations (default).",
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option("--force", help="Import despite a tokenizer fingerprint mismatch (vocab size and k must match)."),
    ] = False,
    k: opt.K = DEFAULT_K,
    model_flag: opt.ModelFlag = None,
) -> None:
    """Bring a matrix file into the data dir, merged with (default) or replacing the stored one; its
    recycled store (INPUT's stem + .store.safetensors) comes with it when there is one."""
    from ..store.transfer import plan_import, read_import

    if replace and merge:
        raise UserError("--merge and --replace exclude each other; pick one")
    model, source = _model_and_file(model_or_input, "INPUT", model_flag)
    incoming = read_import(Path(source))
    owner = _model_matrix(model, k).owner
    with flag_words():
        planned = plan_import(Path(source), incoming, owner, replace_stored=replace, any_tokenizer=force)
        how, data = planned.write_matrix()
        stderr.print(Text(f"{how}: {source} → {planned.target} ({data.rows_filled:,} rows filled)"))
        written = planned.write_recycled_store()
    if written is not None:
        how, recycled = written
        stderr.print(
            Text(
                f"{how}: {planned.recycled_store_source} → {planned.recycled_store_target} "
                f"({len(recycled.documents):,} conversations)"
            )
        )


def _model_and_file(values: list[str], name: str, model_flag: str | None) -> tuple[str | None, str]:
    if len(values) == 1:
        return model_flag, values[0]
    if len(values) == 2:
        return opt.one_model(values[0], model_flag), values[1]
    raise UserError(f"expected [MODEL] {name}, got {len(values)} arguments")


@app.command(name="list")
def list_() -> None:
    """Every stored matrix: model, shape, fill, updates, last update."""
    from ..store.matrix_file import list_matrices

    entries = list_matrices()
    if not entries:
        stderr.print("no stored matrices yet; they appear after tr generate / chat / bench or tr matrix init")
        return
    table = Table()
    for column in ("file", "model", "shape", "filled", "updates", "updated", "size", "store"):
        table.add_column(column, overflow="fold")
    for path, data in entries:
        if data is None:
            table.add_row(Text(path.name), Text("(unreadable)", style="red"), "", "", "", "", "", "")
            continue
        meta = data.meta
        table.add_row(
            Text(path.name),
            Text(meta.model_id),
            f"{meta.vocab_size:,}×{meta.k}",
            f"{100 * data.rows_filled / meta.vocab_size:.1f} %",
            f"{meta.update_count:,}",
            iso(meta.updated_us),
            f"{path.stat().st_size / 1e6:.1f} MB",
            _recycled_store_size(path),
        )
    stdout.print(table)


def _recycled_store_size(matrix_path: Path) -> str:
    """The size of the recycled store beside a matrix (not read: listing stays quick)."""
    from ..store.recycled_file import recycled_store_path

    path = recycled_store_path(matrix_path)
    return _size(path.stat().st_size) if path.exists() else "–"


def _size(n: int) -> str:
    """A recycled store's size: from a few kB (a handful of conversations) to a few MB (full)."""
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"
