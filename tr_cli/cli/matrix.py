"""`tr matrix init | inspect | export | import | list`: manage the hot-start matrices and the
recycled stores kept beside them (`<matrix stem>.store.safetensors`)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace as with_changes
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from ..core.matrix import filled_rows
from ..core.matrix_init import fill_from_token_lists
from ..core.recycled_store import RecycledStore
from ..engine.choices import EngineOptions
from ..errors import MatrixFileError, StoreFileError, UserError
from ..models import load_tokenizer
from ..store.atomic import locked
from ..store.matrix_file import (
    STORE_SUFFIX,
    SUFFIX,
    MatrixFile,
    check_compatible,
    copy_matrix_file,
    default_path,
    list_matrices,
    read_matrix,
    tokenizer_fingerprint,
    write_matrix,
)
from ..store.paths import cache_dir
from ..store.recycled_file import (
    StoreFile,
    StoreMeta,
    copy_store_file,
    merge_documents,
    read_store,
    store_path,
    with_fingerprint,
    write_store,
)
from ..store.timestamps import iso, now_us
from ..text.corpus import read_corpus, token_lists
from . import options as opt
from .completion import complete_matrix
from .console import stderr
from .setup import open_engine

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
    str | None, typer.Option("--model", help="Model whose tokenizer decodes --token when TARGET is a file.")
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

app = typer.Typer(help="Manage the hot-start matrices (one per tokenizer, kept across sessions).", no_args_is_help=True)
stdout = Console(highlight=False, soft_wrap=True)


def _store_path_for(model: str | None, k: int) -> tuple[Path, object, int, str, str]:
    """Default matrix path of a model, with its tokenizer, vocab size, fingerprint and id."""
    tokenizer, vocab_size, source = load_tokenizer(model, cache=cache_dir())
    fingerprint = tokenizer_fingerprint(tokenizer)
    return default_path(fingerprint, vocab_size, k), tokenizer, vocab_size, fingerprint, source.model_id


def _read(path: Path, what: str) -> MatrixFile:
    try:
        return read_matrix(path)
    except MatrixFileError as exc:
        raise MatrixFileError(f"{exc}; {what}") from None


@app.command()
def init(
    model: opt.ModelArgument = None,
    sources: Sources = [],  # noqa: B006 - Typer's way of declaring a repeatable option
    force: Force = False,
    k: opt.K = 8,
    matrix: MatrixTarget = None,
    device: opt.Device = "auto",
    dtype: opt.Dtype = "auto",
) -> None:
    """Build a matrix by running the model over text (prefill; each position's top-k into its token's row),
    and its recycled store from the same text (each text block or prompt one document)."""
    texts = read_corpus(sources)  # validated before the model loads
    loaded = open_engine(
        EngineOptions(model=model, device=device, dtype=dtype, k=k), matrix=False, decoder=False, banner=False
    ).loaded
    fingerprint = tokenizer_fingerprint(loaded.tokenizer)
    path = matrix or default_path(fingerprint, loaded.vocab_size, k)
    if path.exists() and not force:
        raise UserError(f"{path}: a matrix already exists ({_summary(path)}); pass --force to rebuild it")
    if store_path(path).exists() and not force:
        raise UserError(f"{store_path(path)}: a recycled store already exists; pass --force to rebuild it")
    ids = token_lists(loaded.tokenizer, texts)
    data = MatrixFile.empty(loaded.vocab_size, k, fingerprint, loaded.model_id)
    live = data.matrix.to(loaded.device)
    total = sum(len(chunk) for chunk in ids)
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
    ) as progress:
        task = progress.add_task(f"Prefilling {len(texts)} texts", total=total)
        fill_from_token_lists(loaded.model, live, ids, progress=lambda n: progress.advance(task, n))
    data.matrix = live.cpu()
    filled = filled_rows(data.matrix)
    data.stamps[filled] = now_us()
    data.meta = with_changes(data.meta, update_count=data.rows_filled)
    with locked(path):
        write_matrix(path, data)
    stderr.print(
        Text(f"matrix: {data.rows_filled:,} of {loaded.vocab_size:,} rows filled from {total:,} tokens → {path}")
    )
    store = _corpus_store(loaded.vocab_size, ids)
    target = store_path(path)
    with locked(target):
        write_store(target, StoreFile(StoreMeta(loaded.vocab_size, fingerprint, loaded.model_id), store.documents))
    stderr.print(Text(f"store: {len(store.documents):,} texts ({store.total_tokens:,} tokens) → {target}"))


def _corpus_store(vocab_size: int, ids: list[list[int]]) -> RecycledStore:
    """One document per text, stamped in corpus order (distinct stamps: a later merge keeps all)."""
    store = RecycledStore(vocab_size)
    start = now_us()
    for offset, tokens in enumerate(ids):
        store.add(tokens, start + offset)  # too-short texts are skipped: they teach nothing
    return store


def _summary(path: Path) -> str:
    try:
        meta = read_matrix(path).meta
        return f"{meta.update_count:,} row updates, last {iso(meta.updated_us)}"
    except MatrixFileError:
        return "unreadable"


@app.command()
def inspect(
    target: InspectTarget = None,
    model: TokenizerModel = None,
    tokens: Tokens = [],  # noqa: B006 - Typer's way of declaring a repeatable option
    as_json: AsJson = False,
    k: opt.K = 8,
) -> None:
    """Show a matrix: where, how big, whose, how full, and the candidates for given tokens."""
    tokenizer = None
    if target and target.endswith(STORE_SUFFIX):
        raise UserError(f"{target}: a recycled store; pass the matrix beside it ({_matrix_of(target)})")
    if target and (target.endswith(SUFFIX) or Path(target).is_file()):
        path = Path(target)
        data = _read(path, "pass a matrix file written by tr")
        if tokens:
            if model is None:
                raise UserError("--token needs --model MODEL to turn text into token ids for a matrix file")
            tokenizer, vocab_size, _ = load_tokenizer(model, cache=cache_dir())
            check_compatible(data.meta, tokenizer_fingerprint(tokenizer), vocab_size, data.meta.k, path)
    else:
        path, tokenizer, _, _, model_id = _store_path_for(target or model, k)
        if not path.exists():
            raise UserError(
                f"no stored matrix for {model_id} yet ({path}); build one with: tr matrix init {target or ''}".rstrip()
            )
        data = _read(path, "move it away or rebuild it with tr matrix init --force")
    report = _report(path, data)
    report["store"] = _store_report(store_path(path))
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


def _matrix_of(store_file: str) -> str:
    return store_file.removesuffix(STORE_SUFFIX) + SUFFIX


def _store_report(path: Path) -> dict | None:
    """The recycled store beside a matrix: None when there is none, its error when unreadable."""
    if not path.exists():
        return None
    try:
        data = read_store(path)
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


def _describe_store(store: dict | None) -> str:
    if store is None:
        return "none"
    if "error" in store:
        return f"unreadable: {store['error']}"
    text = (
        f"{store['documents']:,} conversations, {store['tokens']:,} of {store['capacity']:,} tokens, "
        f"{_size(store['bytes'])}"
    )
    if store["documents"]:
        text += f", {store['oldest']} to {store['newest']}"
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
        ("store", _describe_store(report["store"])),
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
    k: opt.K = 8,
) -> None:
    """Copy a model's stored matrix to a file (to move it to another machine), and its recycled
    store beside it (OUTPUT's stem + .store.safetensors) when there is one."""
    model, output = _model_and_file(model_or_output, "OUTPUT")
    output = Path(output)
    output_store = store_path(output)
    for target in (output, output_store):
        if target.exists() and not force:
            raise UserError(f"{target}: exists; pass --force to overwrite it")
    if output.suffix != SUFFIX or output.name.endswith(STORE_SUFFIX):
        raise UserError(f"{output}: matrix files end in {SUFFIX}; name it e.g. {output.with_suffix(SUFFIX).name}")
    if not output.parent.is_dir():
        raise UserError(f"{output}: {output.parent} is not a directory; export to an existing directory")
    path, *_ = _store_path_for(model, k)
    if not path.exists():
        raise UserError(f"no stored matrix for {model or 'the default model'} yet ({path}); nothing to export")
    try:
        data, store = _export(path, output, output_store)
    except OSError as exc:  # a read-only or full file system: nothing half written stays (atomic writes)
        raise UserError(f"{output}: cannot write it ({exc.strerror or exc}); export to a writable directory") from None
    extra = f" + store of {len(store.documents):,} conversations → {output_store}" if store else ""
    stderr.print(Text(f"exported {path.name} ({data.rows_filled:,} rows filled) → {output}{extra}"))


def _export(path: Path, output: Path, output_store: Path) -> tuple[MatrixFile, StoreFile | None]:
    """Copy the stored matrix (and its store, when there is one) to `output` (and beside it)."""
    source_store = store_path(path)
    has_store = source_store.exists()
    # The store's lock is held across both copies (taken before the matrix's, as nowhere the
    # other way round), so the exported pair is one moment's state.
    with locked(source_store) if has_store else contextlib.nullcontext():
        if has_store:
            try:
                read_store(source_store)  # refused before anything is written
            except StoreFileError as exc:
                raise UserError(
                    f"{exc}; the stored recycled store is damaged, move it away to export the matrix alone"
                ) from None
        with locked(path):
            try:
                data = copy_matrix_file(path, output)
            except MatrixFileError as exc:
                raise UserError(
                    f"{exc}; the stored matrix is damaged, rebuild it with tr matrix init --force"
                ) from None
        store = copy_store_file(source_store, output_store) if has_store else None
    if store is None:
        output_store.unlink(missing_ok=True)  # a stale one (--force) would be imported with this matrix
    return data, store


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
    k: opt.K = 8,
) -> None:
    """Bring a matrix file into the store, merged with (default) or replacing the stored one; its
    recycled store (INPUT's stem + .store.safetensors) comes with it when there is one."""
    if replace and merge:
        raise UserError("--merge and --replace exclude each other; pick one")
    model, source = _model_and_file(model_or_input, "INPUT")
    incoming = _read(Path(source), "the stored matrix was left untouched")
    path, _, vocab_size, fingerprint, model_id = _store_path_for(model, k)
    meta = incoming.meta
    if meta.vocab_size != vocab_size or meta.k != k:
        raise UserError(
            f"{source}: matrix is {meta.vocab_size:,}×{meta.k}, {model_id} needs {vocab_size:,}×{k} (--k); not imported"
        )
    if meta.fingerprint != fingerprint and not force:
        raise UserError(
            f"{source}: written for another tokenizer (fingerprint {meta.fingerprint}, model {meta.model_id}; "
            f"{model_id} has {fingerprint}), so its ids may mean other tokens; pass --force to import anyway"
        )
    incoming.meta = with_changes(meta, fingerprint=fingerprint)
    incoming_store = _incoming_store(store_path(Path(source)), vocab_size, fingerprint, model_id, force)
    target_store = store_path(path)
    if incoming_store is not None and not replace and target_store.exists():
        _read_store(target_store, "the stored recycled store is damaged; use --replace to overwrite it")
    with locked(path):
        if replace or not path.exists():
            result = incoming
            how = "replaced" if path.exists() else "stored"
        else:
            current = _read(path, "the stored matrix is damaged; use --replace to overwrite it")
            result = current.merged_with(incoming)
            how = "merged"
        write_matrix(path, result)
    stderr.print(Text(f"{how}: {source} → {path} ({result.rows_filled:,} rows filled)"))
    if incoming_store is not None:
        with locked(target_store):
            if replace or not target_store.exists():
                stored = incoming_store
                how = "replaced" if target_store.exists() else "stored"
            else:
                current = _read_store(
                    target_store, "the stored recycled store is damaged; use --replace to overwrite it"
                )
                merged = merge_documents(current.documents, incoming_store.documents, vocab_size, current.meta.capacity)
                stored = StoreFile(current.meta, merged)
                how = "merged"
            write_store(target_store, stored)
        stderr.print(
            Text(f"{how}: {store_path(Path(source))} → {target_store} ({len(stored.documents):,} conversations)")
        )


def _read_store(path: Path, what: str) -> StoreFile:
    try:
        return read_store(path)
    except StoreFileError as exc:
        raise StoreFileError(f"{exc}; {what}") from None


def _incoming_store(path: Path, vocab_size: int, fingerprint: str, model_id: str, force: bool) -> StoreFile | None:
    """The recycled store beside an imported matrix, checked before anything is written."""
    if not path.exists():
        return None
    data = _read_store(path, "nothing was imported")
    meta = data.meta
    if meta.vocab_size != vocab_size:
        raise UserError(
            f"{path}: store is for a vocabulary of {meta.vocab_size:,}, {model_id} has {vocab_size:,}; "
            "nothing was imported"
        )
    if meta.fingerprint != fingerprint:
        if not force:
            raise UserError(
                f"{path}: written for another tokenizer (fingerprint {meta.fingerprint}, model {meta.model_id}), "
                "so its ids may mean other tokens; pass --force to import anyway"
            )
        data = with_fingerprint(data, fingerprint)  # --force: taken as this tokenizer's, like the matrix
    return data


def _model_and_file(values: list[str], name: str) -> tuple[str | None, str]:
    if len(values) == 1:
        return None, values[0]
    if len(values) == 2:
        return values[0], values[1]
    raise UserError(f"expected [MODEL] {name}, got {len(values)} arguments")


@app.command(name="list")
def list_() -> None:
    """Every stored matrix: model, shape, fill, updates, last update."""
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
            _store_size(path),
        )
    stdout.print(table)


def _store_size(matrix_path: Path) -> str:
    """The size of the recycled store beside a matrix (not read: listing stays quick)."""
    path = store_path(matrix_path)
    return _size(path.stat().st_size) if path.exists() else "–"


def _size(n: int) -> str:
    """A store's size: from a few kB (a handful of conversations) to a few MB (full)."""
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"
