"""Find the checkpoint a user points at and open it with the right reader.

SRC may be a checkpoint folder itself, a parent folder with a pointer file (`latest`, or
`latest_universal` for DeepSpeed universal checkpoints) naming a tag sub-folder, or an HF Trainer /
Accelerate FSDP save (`checkpoint-N/` holding the model in `pytorch_model_fsdp_0/`); `tag=` picks a
sub-folder explicitly. The kind is detected from the files in the chosen folder, in this order:
  zbench               manifest.json
  deepspeed-universal  zero/<param>/fp32.pt
  deepspeed            *_model_states.pt or *zero_pp_rank_*_optim_states.pt
  dcp                  .metadata
Readers register with `register_source(kind, probe, opener)` (a later call replaces a kind); an
opener is called as `opener(folder, follow_symlinks=...)`.

SRC is the user's choice and may be a link; everything found inside it is untrusted: the pointer
file and the tag folder must be plain names inside SRC and, unless `follow_symlinks`, not links
(checkpoints.paths). Every error, OS errors included, is one CheckpointError line.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .dcp_source import DcpSource, is_dcp_folder
from .deepspeed_source import DeepSpeedSource, is_deepspeed_folder
from .deepspeed_universal_source import UniversalSource, is_universal_folder
from .paths import inside, one_line, plain_name, read_pointer
from .source import CheckpointError, CheckpointSource
from .zbench_format import set_aside_copy

Probe = Callable[[Path], bool]
Opener = Callable[..., CheckpointSource]  # opener(folder, follow_symlinks=bool)


@dataclass
class _Kind:
    probe: Probe
    opener: Opener | None
    looks_for: str


_KINDS: dict[str, _Kind] = {}


def register_source(kind: str, probe: Probe, opener: Opener | None, looks_for: str = "") -> None:
    """Register (or replace) a reader: `probe(folder)` says whether `opener(folder)` can read it."""
    old = _KINDS.get(kind)
    _KINDS[kind] = _Kind(probe, opener, looks_for or (old.looks_for if old else kind))


def kinds() -> list[str]:
    """The registered kinds, in detection order."""
    return list(_KINDS)


def _open_zbench(folder: Path, follow_symlinks: bool = False) -> CheckpointSource:
    from .zbench_source import ZbenchSource  # imported on demand: the native reader is optional here

    return ZbenchSource(folder, follow_symlinks=follow_symlinks)


register_source("zbench", lambda f: (f / "manifest.json").is_file(), _open_zbench, "manifest.json")
register_source("deepspeed-universal", is_universal_folder, UniversalSource, "zero/<param>/fp32.pt")
register_source("deepspeed", is_deepspeed_folder, DeepSpeedSource, "*_model_states.pt / *_optim_states.pt")
register_source("dcp", is_dcp_folder, DcpSource, ".metadata")


def _match(folder: Path, only: str | None) -> str | None:
    if not folder.is_dir():
        return None
    return next((k for k, spec in _KINDS.items() if (only is None or k == only) and spec.probe(folder)), None)


def _tags(root: Path, only: str | None) -> list[str]:
    return sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".") and _match(d, only))


def _refuse_other_kind(folder: Path, kind: str | None) -> None:
    other = _match(folder, None) if kind else None
    if other and other != kind:
        raise CheckpointError(f"{folder} is a {other} checkpoint, not {kind}; drop --from or pass --from {other}")


def _resolve(root: Path, tag: str | None, kind: str | None, follow_symlinks: bool) -> tuple[Path, str]:
    if kind is not None and kind not in _KINDS:
        raise CheckpointError(f"unknown checkpoint kind {kind!r}; use one of {', '.join(_KINDS)}")
    looked = ", ".join(_KINDS[k].looks_for for k in ([kind] if kind else _KINDS))
    if not root.exists():
        raise CheckpointError(f"{root} does not exist; pass a checkpoint folder")
    if not root.is_dir():
        raise CheckpointError(f"{root} is a file; pass the checkpoint folder that holds it")
    if tag is not None:
        tag = plain_name(tag, "tag (--tag)", f"pass --tag with the name of a tag folder in {root}")
    found = _match(root, kind)
    if found and (tag is None or tag == root.name):
        return root, found
    _refuse_other_kind(root, kind)
    model = _model_folder(root, kind, follow_symlinks) if tag is None else None
    if model is not None:
        return model
    via = "--tag"
    if tag is None:
        pointers = ["latest_universal"] if kind == "deepspeed-universal" else ["latest", "latest_universal"]
        pointer = next((p for p in pointers if os.path.lexists(root / p)), None)
        if pointer is None:
            tags = ", ".join(map(one_line, _tags(root, kind)))  # names read from disk: shown on one line
            hint = f"; it holds checkpoints {tags}: pass --tag with one of them" if tags else _whole_weights_hint(root)
            raise CheckpointError(f"{root} is not a checkpoint folder (looked for latest, {looked}){hint}")
        tag, via = read_pointer(root, pointer, follow_symlinks), f"named by {pointer}"
    folder = inside(root, tag, what="tag folder", follow_symlinks=follow_symlinks)
    found = _match(folder, kind)
    _refuse_other_kind(folder, kind)
    aside = None if found or kind not in (None, "zbench") else set_aside_copy(root, tag)
    if aside is not None:  # a re-save of this tag died between its renames: its complete old copy
        return aside, "zbench"
    if not found:
        tags = ", ".join(map(one_line, _tags(root, kind)))
        fix = f"tags present: {tags}; pass --tag with one of them" if tags else "it holds none"
        raise CheckpointError(f"tag {tag!r} ({via}) is not a checkpoint in {root}; {fix}")
    return folder, found


def locate(path: str | os.PathLike, tag: str | None = None) -> tuple[Path, str] | None:
    """(the checkpoint folder, its kind) at `path` (and `tag`), or None where none is found (never raises)."""
    try:
        return _resolve(Path(path), tag, None, False)
    except (CheckpointError, OSError):
        return None


_LOOKED_AT = 4096  # entries of a folder looked into for checkpoint folders


def holds_checkpoint_folder(root: Path) -> bool:
    """Whether a (non-hidden) folder in `root` is a checkpoint of a kind detected here: a tag folder whose
    `latest` is gone."""
    folders = (p for p in itertools.islice(root.iterdir(), _LOOKED_AT) if not p.name.startswith("."))
    return any(p.is_dir() and not p.is_symlink() and locate(p, None) is not None for p in folders)


def lost_dcp_metadata(root: Path) -> bool:
    """DCP chunk files with no `.metadata` file beside them (none, or a folder, FIFO or link there): a damaged DCP
    save, not an empty folder."""
    try:
        regular = stat.S_ISREG(os.lstat(root / ".metadata").st_mode)
    except OSError:
        regular = False
    return not regular and any(itertools.islice(root.glob("*.distcp"), 1))


# the model's folder inside a save that also holds optimizer and RNG files: HF Trainer / Accelerate FSDP
# (`checkpoint-N/pytorch_model_fsdp_0/` beside `optimizer_0/`)
MODEL_FOLDERS = ("pytorch_model_fsdp_0",)


def _model_folder(root: Path, kind: str | None, follow_symlinks: bool) -> tuple[Path, str] | None:
    for name in MODEL_FOLDERS:
        if os.path.lexists(root / name):
            folder = inside(root, name, what="model folder", follow_symlinks=follow_symlinks)
            found = _match(folder, kind)
            if found:
                return folder, found
    return None


def _os_error(path: str | Path, e: OSError) -> CheckpointError:
    path = e.filename if isinstance(e.filename, str) else path  # the file that failed, when the OS says
    shown = str(path) if len(str(path)) <= 200 else f"{str(path)[:120]}...{str(path)[-40:]}"
    code = errno.errorcode.get(e.errno, "") if e.errno else ""
    return CheckpointError(f"cannot read {shown}: {e.strerror or type(e).__name__}{f' ({code})' if code else ''}; "
                           "check the path and its permissions")


def resolve(path: str | Path, tag: str | None = None, kind: str | None = None,
            follow_symlinks: bool = False) -> tuple[Path, str]:
    """The checkpoint folder `path` (and `tag`) designate, and its kind."""
    try:
        return _resolve(Path(path), tag, kind, follow_symlinks)
    except OSError as e:  # a name too long, a link loop, a folder we may not list
        raise _os_error(path, e) from None


def open_source(path: str | Path, tag: str | None = None, kind: str | None = None,
                follow_symlinks: bool = False, key: str | None = None) -> CheckpointSource:
    """Open the checkpoint at `path` (a checkpoint folder, or its parent with `latest` / `tag`); `key`:
    the prefix of the model's entries in a DCP state dict.

    Links inside `path` are refused unless `follow_symlinks` (the user vouches for them)."""
    folder, found = resolve(path, tag, kind, follow_symlinks)
    opener = _KINDS[found].opener
    if opener is None:
        raise CheckpointError(f"{folder} is a {found} checkpoint, but its reader is not available in this version")
    if key is not None and found != "dcp":
        raise CheckpointError(f"--key applies to DCP checkpoints; {folder} is a {found} checkpoint: drop --key")
    try:
        return opener(folder, follow_symlinks=follow_symlinks, **({"key": key} if key is not None else {}))
    except OSError as e:
        raise _os_error(folder, e) from None


# weights already whole, as Accelerate's save_state (without DeepSpeed or FSDP) and save_pretrained write them
WHOLE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def _whole_weights_hint(root: Path) -> str:
    """The fix for a folder that is no sharded checkpoint: one holding whole weights needs no conversion."""
    whole = next((n for n in WHOLE_WEIGHTS if (root / n).is_file()), None)
    if whole is None:
        return "; pass the folder that holds the checkpoint files"
    return (f"; it holds {whole}, weights that are already whole (as Accelerate's save_state or save_pretrained "
            "writes them): load them directly (safetensors.torch.load_file, from_pretrained or "
            "Accelerator.load_state), no conversion is needed")
