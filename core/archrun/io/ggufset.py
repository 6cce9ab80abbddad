"""Split GGUF files (llama.cpp's ``gguf-split``, gguf-py's ``GGUFWriter(split_max_*)``) read as one.

A model too big for one file ships as parts named ``<prefix>-00001-of-0000N.gguf``. Every part is
a complete GGUF file holding some of the tensors and the keys ``split.no`` (u16, 0-based),
``split.count`` (u16) and ``split.tensors.count`` (i32, the tensors of the whole set); the first
part also holds all of the model's metadata. ``GGUFSet`` opens every part (each validated and
memory-mapped on its own by GGUFFile) and answers like one GGUFFile: the first part's metadata,
the union of the parts' tensors, ``raw``/``raw_rows``/``dequantize`` served from the part that
holds the tensor.

llama.cpp loads a set only from its first part; archrun accepts any part's path and finds the
others by the naming scheme. What makes a set wrong is a SplitSetError naming the part: a part
missing, a part whose ``split.no``/``split.count`` disagree with its name or with the first part
(a part of another set), a tensor count other than ``split.tensors.count``, a tensor in two
parts. A truncated or damaged part is the ModelLoadError GGUFFile raises, prefixed with its name.
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

import numpy as np

from archrun.errors import MissingTensor, ModelLoadError, SplitSetError
from archrun.io.ggufio import GGUFFile, TensorInfo

__all__ = ["GGUFSet", "SPLIT_COUNT", "SPLIT_NO", "SPLIT_TENSORS", "open_gguf", "part_path", "split_of"]

SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS = "split.tensors.count"
_PART_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def part_path(prefix: str | os.PathLike, no: int, count: int) -> pathlib.Path:
    """The path of part ``no`` (0-based) of ``count``, as llama.cpp's llama_split_path names it."""
    return pathlib.Path(f"{os.fspath(prefix)}-{no + 1:05d}-of-{count:05d}.gguf")


def _int_key(gguf: GGUFFile, key: str, lo: int, hi: int) -> int | None:
    """An integer split key within [lo, hi], None when absent; SplitSetError when of another type."""
    if key not in gguf.metadata:
        return None
    value = gguf.metadata[key]
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not lo <= value <= hi:
        raise SplitSetError(f"{gguf.path.name}: {key} = {value!r} is not an integer in [{lo}, {hi}]")
    return int(value)


def split_of(gguf: GGUFFile) -> tuple[int, int] | None:
    """(split.no, split.count) of a part of a set, None for a file that is not split (count absent or 1)."""
    count = _int_key(gguf, SPLIT_COUNT, 1, 65535)
    if count is None or count == 1:
        return None
    no = _int_key(gguf, SPLIT_NO, 0, count - 1)
    if no is None:
        raise SplitSetError(f"{gguf.path.name}: {SPLIT_COUNT} = {count} but no {SPLIT_NO}: not a valid part")
    return no, count


class GGUFSet:
    """The parts of a split GGUF as one read-only model file (see the module docstring)."""

    def __init__(self, parts: list[GGUFFile]) -> None:
        self.parts = tuple(parts)
        first = parts[0]
        self.path: pathlib.Path = first.path
        self.version, self.alignment = first.version, first.alignment
        self.metadata: dict[str, Any] = first.metadata
        self.value_types: dict[str, tuple] = first.value_types
        self._owner: dict[str, GGUFFile] = {}
        self.tensors: dict[str, TensorInfo] = {}  # offsets are within the part that holds the tensor
        for part in parts:
            for name, info in part.tensors.items():
                if name in self._owner:
                    raise SplitSetError(f"tensor {name!r} is in both {self._owner[name].path.name} and "
                                        f"{part.path.name}: a set holds each tensor once")
                self._owner[name], self.tensors[name] = part, info
        expected = _int_key(first, SPLIT_TENSORS, 0, 2**31 - 1)
        if expected is not None and expected != len(self.tensors):
            raise SplitSetError(f"{first.path.name}: {SPLIT_TENSORS} = {expected} but the {len(parts)} parts "
                                f"hold {len(self.tensors)} tensors")

    @property
    def paths(self) -> tuple[pathlib.Path, ...]:
        """Every part's path, in order."""
        return tuple(p.path for p in self.parts)

    def identity(self) -> tuple:
        """What names the set's contents on disk: every part's (device, inode, size, mtime)."""
        return tuple(p.identity() for p in self.parts)

    def part_of(self, name: str) -> GGUFFile:
        """The part that holds tensor ``name`` (MissingTensor if none does)."""
        try:
            return self._owner[name]
        except KeyError:
            raise MissingTensor(f"tensor {name!r} is in no part of {self.path.name}'s set") from None

    def raw(self, name: str) -> np.ndarray:
        """Read-only uint8 view of the tensor's bytes in its part's mapping (no copy)."""
        return self.part_of(name).raw(name)

    def raw_rows(self, name: str) -> np.ndarray:
        """As GGUFFile.raw_rows, from the part that holds the tensor."""
        return self.part_of(name).raw_rows(name)

    def dequantize(self, name: str) -> np.ndarray:
        """As GGUFFile.dequantize, from the part that holds the tensor."""
        return self.part_of(name).dequantize(name)

    def check_finite(self, name: str) -> None:
        """As GGUFFile.check_finite, on the part that holds the tensor."""
        self.part_of(name).check_finite(name)

    def check_intact(self) -> None:
        """ModelLoadError when any part shrank since it was opened (see GGUFFile.check_intact)."""
        for part in self.parts:
            part.check_intact()

    def release_pages(self) -> None:
        """Let the kernel drop every part's resident pages."""
        for part in self.parts:
            part.release_pages()

    def close(self) -> None:
        for part in self.parts:
            part.close()

    def __enter__(self) -> GGUFSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFSet({str(self.path)!r}, {len(self.parts)} parts, {len(self.tensors)} tensors)"


def open_gguf(path: str | os.PathLike) -> GGUFFile | GGUFSet:
    """Open and validate a GGUF file (archrun.io.ggufio.GGUFFile), or the whole set when it is a part of a split
    model (any part's path; a GGUFSet answers like a GGUFFile)."""
    gguf = GGUFFile(path)
    try:
        split = split_of(gguf)
        if split is None:
            return gguf
        return _open_set(gguf, *split)
    except BaseException:
        gguf.close()
        raise


def _open_set(given: GGUFFile, no: int, count: int) -> GGUFSet:
    match = _PART_NAME.match(given.path.name)
    if match is None or int(match["no"]) != no + 1 or int(match["count"]) != count:
        raise SplitSetError(f"{given.path.name} is part {no + 1} of {count} of a split model, but its name does "
                            f"not say so (<prefix>-{no + 1:05d}-of-{count:05d}.gguf): the other parts cannot "
                            "be found")
    prefix = given.path.with_name(match["prefix"])
    parts: list[GGUFFile] = []
    try:
        for i in range(count):
            parts.append(given if i == no else _open_part(part_path(prefix, i, count), i, count))
        _check_parts(parts)
        return GGUFSet(parts)
    except BaseException:
        for p in parts:
            if p is not given:
                p.close()
        raise


def _open_part(path: pathlib.Path, no: int, count: int) -> GGUFFile:
    if not path.exists():
        raise SplitSetError(f"part {no + 1} of {count} of the split model is missing: {path} does not exist")
    try:
        part = GGUFFile(path)
    except ModelLoadError as e:
        raise type(e)(f"part {no + 1} of {count}: {e}") from None
    try:
        got = split_of(part)
        if got != (no, count):
            said = "is not split" if got is None else f"says it is part {got[0] + 1} of {got[1]}"
            raise SplitSetError(f"{path.name} {said}, not part {no + 1} of {count}: it belongs to another set")
    except BaseException:
        part.close()
        raise
    return part


def _check_parts(parts: list[GGUFFile]) -> None:
    """The parts agree on the set's tensor count, and only the first carries the architecture."""
    first = parts[0]
    want = first.metadata.get(SPLIT_TENSORS)
    arch = first.metadata.get("general.architecture")
    for part in parts[1:]:
        if part.metadata.get(SPLIT_TENSORS) != want:
            raise SplitSetError(f"{part.path.name}: {SPLIT_TENSORS} = {part.metadata.get(SPLIT_TENSORS)!r} but "
                                f"{first.path.name} says {want!r}: the parts belong to different sets")
        other = part.metadata.get("general.architecture")
        if other is not None and other != arch:
            raise SplitSetError(f"{part.path.name} is a {other!r} model, {first.path.name} a {arch!r} one: "
                                "the parts belong to different sets")
