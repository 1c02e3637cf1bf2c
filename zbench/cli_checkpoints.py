"""`zbench convert` and `zbench inspect`: checkpoint conversion and inspection on the command line.

Both read any kind `checkpoints.detect` knows (zbench, DeepSpeed ZeRO-1/2/3, DeepSpeed universal,
torch.distributed.checkpoint). User errors are one `Error: ...` line with the fix, and leave disk untouched.
Links inside SRC are refused unless `--follow-symlinks`; the output is claimed, staged and renamed
into place by checkpoints.output_claim, and never inside SRC.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

import click
import torch

from checkpoints.consolidate import first_problem, parse_size, write_consolidated
from checkpoints.detect import kinds, open_source
from checkpoints.hf_folder import check_hf_config, copy_hf_files, hf_files, tie_index
from checkpoints.io_errors import ACCESS, PATH, SPACE, write_cause
from checkpoints.output_claim import check_output
from checkpoints.read_guard import FolderWatch
from checkpoints.source import CheckpointError, CheckpointSource, ParamInfo

from .cli_lazy import FINISHED
from .printable import printable

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _human(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


@contextmanager
def _one_line() -> Iterator[None]:
    """A checkpoint problem, or an OS error while reading one, as one `Error:` line."""
    try:
        yield
    except CheckpointError as e:
        raise click.ClickException(str(e))
    except OSError as e:
        raise click.ClickException(
            f"cannot read {e.filename or 'the checkpoint'}: {e.strerror or e}; check the path and its permissions"
        )


def _open(
    src: str, tag: str | None, kind: str | None, follow_symlinks: bool, key: str | None = None
) -> CheckpointSource:
    with _one_line():
        return open_source(src, tag=tag, kind=kind, follow_symlinks=follow_symlinks, key=key)


_KEY = click.option(
    "--key",
    default=None,
    help="DCP: the dotted prefix of the model's entries (default: 'model', '<app>.model' or the top level).",
)
_FOLLOW = click.option(
    "--follow-symlinks",
    is_flag=True,
    help="Read through symbolic links inside SRC (refused by default: they may point anywhere).",
)


@click.command()
@click.argument("src", type=click.Path())
@click.option(
    "--to",
    "to",
    required=True,
    type=click.Choice([*_DTYPES, "zbench"]),
    help="Output: consolidated safetensors in this dtype, or a zbench checkpoint.",
)
@click.option("--out", required=True, type=click.Path(), help="Output folder (new or empty).")
@click.option(
    "--max-shard-size",
    default="5GB",
    show_default=True,
    help="Split the safetensors output into shards of at most this size.",
)
@click.option("--tag", default=None, help="Checkpoint tag folder inside SRC (default: the one named by SRC/latest).")
@click.option("--from", "kind", default=None, type=click.Choice(kinds()), help="Source kind (default: detected).")
@click.option(
    "--world-size", default=None, type=click.IntRange(1), help="Ranks of the resharded checkpoint (--to zbench)."
)
@click.option("--no-verify", is_flag=True,
              help="Skip verifying the source files' checksums and CRCs (otherwise checked in the same pass as the "
                   "conversion).")
@click.option(
    "--hf-config",
    default=None,
    type=click.Path(),
    help="A Hugging Face config.json for the output folder (default: the one beside SRC, if any).",
)
@_KEY
@_FOLLOW
def convert(
    src: str,
    to: str,
    out: str,
    max_shard_size: str,
    tag: str | None,
    kind: str | None,
    world_size: int | None,
    no_verify: bool,
    hf_config: str | None,
    key: str | None,
    follow_symlinks: bool,
) -> None:
    """Convert checkpoint SRC into consolidated safetensors (fp32/bf16/fp16) or a resharded zbench checkpoint."""
    try:
        shard_bytes = parse_size(max_shard_size)
    except ValueError as e:
        raise click.ClickException(f"--max-shard-size: {e}")
    if to == "zbench" and world_size is None:
        raise click.ClickException(
            "--to zbench needs --world-size M (the number of ranks to reshard for); add --world-size M"
        )
    if to != "zbench" and world_size is not None:
        raise click.ClickException(f"--world-size applies to --to zbench only; drop it for --to {to}")
    if world_size is not None:
        from checkpoints.reshard import check_world_size

        try:
            check_world_size(world_size)
        except CheckpointError as e:
            raise click.ClickException(str(e))
    if hf_config is not None:
        if to == "zbench":
            raise click.ClickException("--hf-config applies to --to fp32|bf16|fp16 only; drop it for --to zbench")
        try:
            check_hf_config(hf_config)
        except CheckpointError as e:
            raise click.ClickException(str(e))
    try:
        check_output(out, protect=[src])  # before any reading: a refused --out costs nothing
    except CheckpointError as e:
        raise click.ClickException(str(e))
    except OSError as e:
        raise _cannot_write(out, e)
    source = _open(src, tag, kind, follow_symlinks, key)
    try:
        hf = [] if to == "zbench" else hf_files(src, hf_config, follow_symlinks)  # refused before any writing
    except CheckpointError as e:
        raise click.ClickException(str(e))
    if not no_verify and to == "zbench":
        with _one_line():
            problems = source.verify()
        if problems:
            raise click.ClickException(first_problem(problems))
    try:
        if to == "zbench":
            try:
                from checkpoints.reshard import reshard_to_zbench
            except ImportError:
                raise click.ClickException("--to zbench is not available yet in this version; use --to fp32|bf16|fp16")
            written = reshard_to_zbench(source, out, world_size, protect=[src])
            _finished(f"{printable(written)} is complete")
            click.echo(f"wrote a zbench checkpoint for {world_size} ranks to {printable(written)}")
            return
        copied: list[str] = []

        def add_hf_files(folder: Path) -> None:  # an HF folder, from_pretrained-loadable, published whole
            if hf:
                tie_index(folder)  # tied names as save_pretrained writes them
            copy_hf_files(hf, folder, copied)

        files = write_consolidated(
            source,
            out,
            _DTYPES[to],
            shard_bytes,
            progress=sys.stderr.isatty(),
            protect=[src],
            verify=not no_verify,
            add_files=add_hf_files,
        )  # checked in the same pass
        _finished(f"{printable(out)} is complete")
    except CheckpointError as e:
        raise click.ClickException(str(e))
    except OSError as e:  # a full disk, a quota, a folder we may not write: the output was removed again
        raise _cannot_write(out, e)
    infos = source.params()
    tied = sum(1 for i in infos if i.tied_to)
    size = sum(f.stat().st_size for f in files)
    click.echo(
        f"wrote {len(infos)} tensors ({tied} tied, stored once) as {to} in {len(files)} file(s), "
        f"{_human(size)}, to {printable(out)}" + (f", with {', '.join(copied)}" if copied else "")
    )
    left_out = source.summary().extra.get("left out by the save")
    if left_out:  # as DeepSpeed's zero_to_fp32 leaves them out: the base model's own weights come from elsewhere
        click.echo(
            f"not written: {printable(left_out)}; the checkpoint does not hold them, take them from the base model"
        )


def _cannot_write(out: str, e: OSError) -> click.ClickException:
    what, kind = write_cause(e)
    fix = {SPACE: "free space there or pass --out on another disk", ACCESS: "pass a writable --out",
           PATH: "move that file away or pass another --out"}.get(kind, "fix that")
    return click.ClickException(f"cannot write {out}: {what}; {fix}; nothing was written")


def _finished(what: str) -> None:
    """Mark the output as published: a Ctrl-C from here on says so instead of "run it again" (cli_lazy.py)."""
    click.get_current_context().meta[FINISHED] = what


def _unless_replaced(watch: FolderWatch) -> None:
    try:
        watch.check("what was checked could mix two checkpoints; run zbench inspect again")
    except CheckpointError as e:
        raise click.ClickException(str(e)) from None


def _records_roles(source: CheckpointSource) -> bool:
    """Whether the source's format marks tied, frozen and buffer entries (DCP saves every entry alike)."""
    return getattr(source, "records_roles", True)


def _roles(source: CheckpointSource, infos: list[ParamInfo]) -> str:
    """The tensor count with its tied and frozen-or-buffer counts, where the format records them."""
    if not _records_roles(source):
        return f"{len(infos)} (a {source.kind} checkpoint does not record which are tied, frozen or buffers)"
    tied = sum(1 for i in infos if i.tied_to)
    return f"{len(infos)} ({tied} tied, {sum(1 for i in infos if not i.trainable and not i.tied_to)} frozen or buffers)"


@click.command()
@click.argument("src", type=click.Path())
@click.option("--tag", default=None, help="Checkpoint tag folder inside SRC (default: the one named by SRC/latest).")
@click.option("--from", "kind", default=None, type=click.Choice(kinds()), help="Source kind (default: detected).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_KEY
@_FOLLOW
def inspect(src: str, tag: str | None, kind: str | None, as_json: bool, key: str | None, follow_symlinks: bool) -> None:
    """Say what checkpoint SRC is (kind, step, stage, world size, params, dtypes, size) and check its files."""
    source = _open(src, tag, kind, follow_symlinks, key)
    watch = FolderWatch(source)
    try:
        with _one_line():
            s = source.summary()
            infos = source.params()
            problems = source.verify()
    except click.ClickException:
        _unless_replaced(watch)  # a file gone or changed under the reader is a re-save, not damage
        raise
    _unless_replaced(watch)  # what was read may mix two checkpoints: judged by neither
    if as_json:
        click.echo(json.dumps({**asdict(s), "tensors": len(infos), "problems": problems}, indent=2, default=str))
    else:
        rows = [
            ("kind", s.kind),
            ("path", s.path),
            ("step", s.step),
            ("stage", s.stage),
            ("world size", s.world_size),
            ("tensors", _roles(source, infos)),
            ("elements", f"{s.num_params:,} ({'tied counted once' if _records_roles(source) else 'all counted'})"),
            ("dtypes", ", ".join(f"{k} {v:,}" for k, v in s.dtypes.items())),
            ("size on disk", _human(s.bytes_on_disk)),
            *((k, v) for k, v in s.extra.items()),
            ("integrity", "ok" if not problems else f"{len(problems)} problem(s)"),
        ]
        width = max(len(k) for k, _ in rows) + 2
        for k, v in rows:
            click.echo(f"{k:<{width}}{'-' if v is None else printable(v)}")  # a path on its one line
    if problems:
        raise click.ClickException(first_problem(problems))
