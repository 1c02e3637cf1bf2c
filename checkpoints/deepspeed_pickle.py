"""Load DeepSpeed's torch.save pickles safely, without DeepSpeed installed.

DeepSpeed pickles a few of its own classes into checkpoints (the loss scaler, the ZeRO stage enum,
the fragment addresses of `param_slice_mappings`, ...). We load with torch's weights-only unpickler,
which refuses every global that is not allowlisted, and allowlist *inert stand-ins* registered
under those DeepSpeed names (and, for a client_state's argparse Namespace and numpy values, those of
pickle_plain_types.py): nothing from the file is ever imported or executed. Any other global is refused
with a CheckpointError naming the file and the global.

torch_file_reader.py loads the structure with meta tensors and reads tensor bytes itself; a plain
load here memory-maps zip-format files, so only the pages a caller touches are read from disk.
"""

from __future__ import annotations

import errno
import math
import pickle
import re
import warnings
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .pickle_plain_types import PLAIN_TYPES, REFUSABLE
from .source import CheckpointError
from .torch_storage_ids import storage_problem
from .zip_crc import first_bad_record


class DeepSpeedObject:
    """Stand-in for a DeepSpeed object (loss scaler, config object): keeps its pickled attributes."""

    def __new__(cls, *args: Any, **kwargs: Any) -> "DeepSpeedObject":
        obj = super().__new__(cls)
        obj.__dict__["_args"] = args
        return obj

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"DeepSpeedObject({ {k: v for k, v in self.__dict__.items() if k != '_args'} })"


class DeepSpeedEnum:
    """Stand-in for a DeepSpeed Enum: pickle rebuilds enums as `Cls(value)`; we return the plain value."""

    def __new__(cls, value: Any, *_: Any) -> Any:  # type: ignore[misc]
        return value


@dataclass
class FragmentAddress:
    """Stand-in for deepspeed.utils.tensor_fragment.fragment_address: a slice of a rank's flat partition."""

    numel: int = 0
    start: int = 0


# DeepSpeed names that appear in ZeRO and universal checkpoints, mapped to inert stand-ins.
STAND_INS: dict[str, type] = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": DeepSpeedObject,
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": DeepSpeedObject,
    "deepspeed.runtime.fp16.loss_scaler.LossScalerBase": DeepSpeedObject,
    "deepspeed.runtime.fp16.loss_scaler.LossScaleConfig": DeepSpeedObject,
    "deepspeed.runtime.fp16.loss_scaler.LossScaleProfile": DeepSpeedEnum,
    "deepspeed.runtime.zero.config.ZeroStageEnum": DeepSpeedEnum,
    "deepspeed.runtime.zero.offload_config.OffloadDeviceEnum": DeepSpeedEnum,
    "deepspeed.utils.tensor_fragment.fragment_address": FragmentAddress,
    "deepspeed.checkpoint.universal_checkpoint.SubparamShape": DeepSpeedObject,
}


MAX_DEPTH = 64  # nesting of a loaded structure: DeepSpeed's deepest (its config, the optimizer state) is under 10


def _children(o: Any) -> Any:
    if isinstance(o, dict):
        return o.values()
    if isinstance(o, (list, tuple, set, frozenset)):
        return o
    return vars(o).values() if hasattr(o, "__dict__") else ()


def walk(path: Path, obj: Any) -> list[torch.Tensor]:
    """Every tensor in a loaded structure of dicts, lists, tuples and stand-in objects, each once. A structure
    that contains itself, or nests deeper than MAX_DEPTH, is refused with a CheckpointError naming its top-level
    entry: each container is entered once (shared ones too), so the walk is bounded by the file's size."""
    found: list[torch.Tensor] = []
    done: set[int] = set()  # containers and tensors seen (ids: the structure holds them for the walk's length)
    open_: set[int] = set()  # containers on the current path from the root
    stack: list[tuple[Any, int, Any, bool]] = [(obj, 0, None, False)]
    while stack:
        o, depth, top, leaving = stack.pop()
        if leaving:
            open_.discard(id(o))
            continue
        if isinstance(o, REFUSABLE) and o.problem:
            raise CheckpointError(f"{path}: {_where(top)} {o.problem}, which zbench does not read (numpy values of "
                                  "numbers, booleans or text, Namespaces of names only); save such client_state "
                                  "entries as plain data")
        if isinstance(o, torch.Tensor):
            if id(o) not in done:
                done.add(id(o))
                found.append(o)
            continue
        kids = _children(o)
        if id(o) in open_:
            raise CheckpointError(f"{path}: {_where(top)} a {type(o).__name__} that contains itself; {_NOT_SAVED}")
        if not kids or id(o) in done:
            continue
        if depth >= MAX_DEPTH:
            raise CheckpointError(f"{path}: {_where(top)} containers nested deeper than {MAX_DEPTH} levels; "
                                  f"{_NOT_SAVED}")
        done.add(id(o))
        open_.add(id(o))
        stack.append((o, depth, top, True))
        if depth == 0 and isinstance(o, dict):
            stack.extend((v, 1, k, False) for k, v in o.items())
        else:
            stack.extend((v, depth + 1, top, False) for v in kids)
    return found


def _where(top: Any) -> str:
    return f"its entry {shown(top)} holds" if top is not None else "it holds"


_NOT_SAVED = "torch.save of a training run never writes that: copy the file again from the run that saved it"


def load_pickle(path: Path, mmap: bool = True, map_location: str = "cpu") -> Any:
    """torch.load `path` with DeepSpeed stand-ins, on the CPU (memory-mapped when `mmap` and the file is a zip)
    or with meta tensors that read nothing; every failure is a one-line CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"missing file {path}; the checkpoint is incomplete: copy it again from where it was saved"
        )
    use_mmap = mmap and map_location == "cpu" and zipfile.is_zipfile(path)  # mmap needs the zip format
    problem = _storages_problem(path)
    if problem:
        raise CheckpointError(f"{path} is truncated or corrupt ({problem}); copy the file again from where it was "
                              "saved")
    try:  # torch's warnings about the file (an old pickle protocol, ...) would break the one-line report
        allowed = [(cls, name) for name, cls in {**STAND_INS, **PLAIN_TYPES}.items()]
        with torch.serialization.safe_globals(allowed), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = torch.load(path, map_location=map_location, weights_only=True, mmap=use_mmap)
    except pickle.UnpicklingError as e:
        refused = re.search(r"GLOBAL ([\w.]+)|unrecognized function (\S+)|but got (\S+)", str(e))
        if refused:
            name = next(g for g in refused.groups() if g)
            raise CheckpointError(
                f"{path} references {name}, which zbench refuses to load (only tensors, plain containers, "
                "argparse Namespaces, numpy values and DeepSpeed's checkpoint classes are accepted); is this really "
                "a checkpoint file?"
            ) from None
        raise CheckpointError(
            f"{path} is truncated or corrupt ({_first_line(e)}); copy the file again from where it was saved"
        ) from None
    except OSError as e:  # cannot be opened or read (permissions, I/O error); EINVAL: torch's read of a cut zip
        if e.errno == errno.EINVAL:
            raise CheckpointError(
                f"{path} is truncated or corrupt (its records run past its end); copy the file again from where it "
                "was saved"
            ) from None
        raise CheckpointError(
            f"cannot read {path}: {e.strerror or _first_line(e)}; check that the file is readable"
        ) from None
    except Exception as e:  # noqa: BLE001 - crafted opcodes reach the unpickler's internals (BUILD on a set, ...)
        raise CheckpointError(
            f"{path} is truncated or corrupt ({_first_line(e)}); copy the file again from where it was saved"
        ) from None
    walk(path, loaded)  # refuses a structure that contains itself before anything walks or prints it
    return loaded


def _storages_problem(path: Path) -> str | None:
    """Before torch reads a zip: a storage claiming more bytes than its record (torch would read past it)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return storage_problem(zf)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return None  # not a zip (a legacy pickle), or one torch's reader names better


REWRITE = "the file is damaged or was not written by DeepSpeed: copy it again from the run that saved it"


def shown(value: Any) -> str:
    """A short one-line rendering of a value read from a file (long text cut, huge integers by size)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    return f"a {type(value).__name__}"


def bad_field(path: Path, key: str, value: Any, want: str) -> CheckpointError:
    """The one-line error for field `key` of `path`: its value, what it should be, and the fix."""
    return CheckpointError(f"{path}: {key} is {shown(value)}, not {want}; {REWRITE}")


def checked_number(
    path: Path, key: str, value: Any, lo: float, hi: float, integer: bool = True, above: bool = False
) -> Any:
    """`value` (field `key` of `path`) when it is an int (or, unless `integer`, a finite float) in [lo, hi]
    ((lo, hi] when `above`); else bad_field's CheckpointError. Bools are refused: pickle keeps them apart."""
    kind = isinstance(value, int) or (not integer and isinstance(value, float) and math.isfinite(value))
    if isinstance(value, bool) or not kind or value > hi or value < lo or (above and value == lo):
        span = f"{'(' if above else '['}{lo}, {hi}]"
        raise bad_field(path, key, value, f"{'an integer' if integer else 'a finite number'} in {span}")
    return value


def _first_line(e: BaseException) -> str:
    """The first sentence of an exception's message (torch's reader errors run on for lines)."""
    lines = [_ENFORCE.sub("", line) for line in str(e).splitlines() if _ENFORCE.sub("", line).strip()]
    return (lines[0].split(". ")[0] if lines else type(e).__name__)[:120]


_ENFORCE = re.compile(r"^\s*\[enforce fail at [^\]]*\][\s.]*")  # the C++ source line torch's reader errors start with


def check_zip_file(path: Path) -> str | None:
    """CRC-check every record of a torch.save zip file (DeepSpeed stores no checksums of its own).

    torch.load does not verify the zip CRCs, so a flipped bit in tensor data would load silently;
    this reads the whole file once, in chunks. Returns a one-line problem naming the file, or None.
    """
    path = Path(path)
    if not path.is_file():
        return f"missing file {path}"
    if not zipfile.is_zipfile(path):
        return None if _legacy_pickle_ok(path) else f"{path} is truncated or corrupt (not a readable torch.save file)"
    try:
        bad = first_bad_record(path)
        storages = None if bad is not None else _storages_problem(path)  # what no CRC tells: sizes in the pickle
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as e:
        return f"{path} is truncated or corrupt ({str(e)[:120]})"
    if storages is not None:
        return f"{path} is corrupt ({storages})"
    return None if bad is None else f"{path} is corrupt: record {bad} fails its CRC check"


def check_zip_files(paths: list[Path]) -> list[str]:
    """check_zip_file over many files, two at a time (reads and CRCs release the GIL); problems in path order."""
    with ThreadPoolExecutor(2, thread_name_prefix="zbench-verify") as pool:
        return [p for p in pool.map(check_zip_file, paths) if p]


def _legacy_pickle_ok(path: Path) -> bool:
    """Pre-zip torch.save files carry no checksum: the best check is that they load."""
    try:
        load_pickle(path, mmap=False)
    except CheckpointError:
        return False
    return True
