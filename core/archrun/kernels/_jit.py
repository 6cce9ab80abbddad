"""Shared numba options and layout constants of the kernels, and where their compiled code is cached."""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
import types
import uuid
import warnings
from pathlib import Path

try:
    import fcntl
except ImportError:  # no advisory locks (Windows): unused cache folders are pruned by age alone
    fcntl = None

# The float flags of every kernel: a kernel's bits must depend on its inputs only. LLVM may assume
# its float operands are neither NaN nor infinite (nnan, ninf): the folds those allow are exact for
# finite values (x - x -> 0, comparisons without NaN cases, vectorised min/max). It may NOT
# reassociate sums (reassoc), fuse a * b + c into one rounding (contract), turn divisions into
# reciprocals (arcp), approximate functions (afn) or drop the sign of zero (nsz): each of those is
# applied or not depending on how a caller inlined the kernel and on the compile itself, so a
# product computed for one token, a batch row, a verification span or in another process would
# round differently. Reductions state their order in code (lane accumulators, explicit trees) and
# fused multiply-adds are explicit (llvm.fma in the SIMD intrinsics). docs/determinism.md lists the
# kernels and their flags.
EXACT_MATH = frozenset({"nnan", "ninf"})
# Every kernel: cached per CPU model, the exact float flags above, releases the GIL.
# error_model="numpy": a float division by zero gives Inf/NaN as IEEE says instead of raising
# ZeroDivisionError, so activations that overflow (finite weights near float32's limit) end in NaN
# logits, which the sampler reports (NumericalError), exactly as on the reference backend.
JIT = dict(cache=True, fastmath=set(EXACT_MATH), nogil=True, error_model="numpy")
# Kernels that split output rows over numba's thread pool.
JIT_PAR = dict(JIT, parallel=True)

# Output rows are interleaved in groups of LANES: one SIMD lane per row, so a 32-element
# block of all rows of a group is dotted with one activation block without horizontal sums.
LANES = 32
# Quantized activations and repacked weights use 32-element blocks for every type.
QB = 32


# -- a cache keyed by the sources ----------------------------------------------------------------
# numba keys a cached kernel by its own bytecode and checks it against its own file, but the
# compiled code also contains the kernels it calls from other files (block.py calls dots.py;
# archrun-blocks' MoE layer kernel calls layer.py's steps) and the constants it reads (LANES).
# One cache shared by processes that imported different sources hands a process code compiled
# from another's sources (seen: segfaults after a kernel edit, when a process that had imported
# the old sources wrote its entries after a new one had emptied the cache).
#
# So the compiled kernels of a folder live in a cache folder named by a digest of every kernel
# source their code can contain, as this process read them (for a plugin folder: the core's
# digest and the plugin's sources): a process reads and writes only entries compiled from exactly
# the sources it runs, and processes with different sources never share a folder. A kernel file
# that changed between the digest and its import compiles into a folder of this process alone.
#
# Location: <base>/archrun-<folder name>-<digest[:16]>/, base = NUMBA_CACHE_DIR when set, else
# $XDG_CACHE_HOME/archrun/numba (~/.cache/archrun/numba). Each process holds a shared lock on
# its folders' `in-use` file while it runs (released by the OS when it exits, even killed) and
# sets its mtime (the folder's last use). When a process creates a folder, the folders of base
# beyond the KEEP most recently used are removed, except those a running process holds.
# Without advisory locks (Windows) only folders unused for MAX_AGE are removed.

KEEP = 8
MAX_AGE = 7 * 24 * 3600.0
_IN_USE = "in-use"
_FOLDER = re.compile(r"archrun-.+-[0-9a-f]{16}")
# the kernels' code may contain these (a file without any holds no kernel: editing it keeps the cache)
_KERNELS = re.compile(rb"\bn?jit\b|\bintrinsic\b|\boverload|\bregister_jitable\b|\bcfunc\b")


class _Sources:
    """The kernel sources of one folder as hashed at registration, and their cache folder."""

    def __init__(self, digest: str, files: dict[str, bytes], path: str | None, within: tuple[_Sources, ...]):
        # within: the folders whose kernels this folder's kernels embed (the core's; other plugins' it declares)
        self.digest, self.files, self.path, self.within = digest, files, path, within
        self.verified: dict[str, bool] = {}
        self.changed = False  # a kernel file of the folder differs from its digest

    def location(self, file: str) -> tuple[str, bytes]:
        """(cache folder, source stamp) for the kernels of `file`, read again now that it is imported.
        A file that changed since the digest (or is not in it) gets this process's own folder, and so
        does every kernel of its folder or of a plugin folder over it decorated afterwards: their code
        may contain the changed file's (a kernel's callees are imported before it is decorated)."""
        recorded = self.files.get(file)
        if file not in self.verified:
            try:
                self.verified[file] = recorded == hashlib.sha256(Path(file).read_bytes()).digest()
            except OSError:
                self.verified[file] = False
            if not self.verified[file]:
                self.changed = True
                warnings.warn(f"archrun: {file} changed while it was imported (or holds kernels its folder's "
                              "digest missed); kernels compile without the shared cache in this process",
                              RuntimeWarning, stacklevel=2)
        if self.path is None or self.changed or any(w.changed for w in self.within):
            return _private_folder(), recorded or b""
        return self.path, recorded


_REGISTERED: dict[str, _Sources] = {}  # real path of a kernel folder -> its sources
_HELD: list = []  # the open `in-use` files of this process's cache folders (their locks)
_PRIVATE: list[str] = []


def cache_base() -> Path:
    """The folder under which the kernels' cache folders live (NUMBA_CACHE_DIR when set)."""
    import numba

    configured = numba.config.CACHE_DIR or os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "archrun" / "numba"


def kernel_cache(package_file: str | os.PathLike, embeds: tuple[types.ModuleType, ...] = ()) -> str | None:
    """Cache the compiled kernels of `package_file`'s folder under a digest of their sources and the core's.

    A vocabulary plugin with numba kernels (`cache=True`, e.g. `**JIT`) calls
    `kernel_cache(__file__)` at the top of its kernel package's `__init__.py`, before its kernel
    modules are imported: its kernels embed the core's (products, the layer kernel's steps), so
    their cache must change whenever either's sources do. `embeds`: the kernel packages of other
    plugins whose kernels this folder's kernels call (imported modules, e.g. `archrun_blocks`; each calls
    kernel_cache itself): their sources join the digest too, so an edit there compiles these kernels
    again instead of loading code that holds the old callees. Returns the cache folder (None when
    the JIT is disabled or the cache is unusable: the kernels then compile in every process).
    """
    folder = os.path.realpath(package_file)
    if not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    if folder in _REGISTERED:
        return _REGISTERED[folder].path
    name = os.path.basename(folder)
    late = sorted(m.__name__ for m in list(sys.modules.values())
                  if isinstance(f := getattr(m, "__file__", None), str) and os.path.basename(f) != "__init__.py"
                  and os.path.basename(os.path.dirname(f)) == name and os.path.dirname(os.path.realpath(f)) == folder)
    if late:
        warnings.warn(f"archrun: kernel_cache({folder!r}) after {', '.join(late)} was imported; call it at the "
                      "top of the package", RuntimeWarning, stacklevel=2)
    return _register(folder, (_REGISTERED[_CORE], *(_embedded(module) for module in embeds))).path


def _embedded(module: types.ModuleType) -> _Sources:
    """The registered sources of the (imported) kernel package `module`."""
    folder = os.path.dirname(os.path.realpath(module.__file__))
    if folder not in _REGISTERED:
        raise ImportError(f"archrun: kernel_cache(embeds=...) names {module.__name__}, which does not call "
                          "kernel_cache")
    return _REGISTERED[folder]


def guard_cache(probe: object) -> None:
    """Former name of `kernel_cache`, taking a function of the kernel folder: kernel_cache(its file)."""
    kernel_cache(probe.__code__.co_filename)


def _register(folder: str, within: tuple[_Sources, ...]) -> _Sources:
    """Digest the kernel sources of `folder` (and those of `within`: the core's and any other folders whose
    kernels they call; empty for the core itself)."""
    import numba

    if not JIT["cache"] or numba.config.DISABLE_JIT:
        sources = _Sources("", {}, None, within)
    else:
        import llvmlite

        # numba's own code and the flags that change compiled code without changing numba's cache key
        salt = (" ".join(w.digest for w in within) if within
                else f"{LANES} {QB} {_options_text(JIT_PAR)}")  # the core: its constants
        h = hashlib.sha256(f"{salt} {numba.__version__} {llvmlite.__version__} {numba.config.BOUNDSCHECK} "
                           f"{numba.config.OPT}".encode())
        files = {}
        # the core's kernels span its subpackages (the matmul engine, the decode runtime); a plugin's, one folder
        for src in sorted(Path(folder).glob("*.py") if within else Path(folder).rglob("*.py")):
            if str(src) == os.path.realpath(__file__):
                continue  # this file: only its constants (in the core's salt) reach compiled code
            try:
                text = src.read_bytes()
            except OSError:
                continue
            if _KERNELS.search(text):
                files[str(src)] = hashlib.sha256(text).digest()
                h.update(src.relative_to(folder).as_posix().encode() + b"\0" + files[str(src)])
        digest = h.hexdigest()
        try:
            path = cache_base() / f"archrun-{Path(folder).name}-{digest[:16]}"
            if _claim(path):
                _prune(path)
        except (OSError, RuntimeError):  # no writable cache folder (or no home): this process's own folder
            path = None
        sources = _Sources(digest, files, None if path is None else str(path), within)
        _forget_in_tree_cache(Path(folder))
    _REGISTERED[folder] = sources
    return sources


def _options_text(options: dict) -> str:
    """The numba options as text that is the same in every process: a set's repr follows the
    process's string-hash seed ({'nnan', 'ninf'} or {'ninf', 'nnan'}), so sets are sorted first
    (unsorted, every other process digested the core differently and missed the cache)."""
    return repr(sorted((k, sorted(v) if isinstance(v, (set, frozenset)) else v) for k, v in options.items()))


def _claim(path: Path) -> bool:
    """Mark `path` used by this process until it exits; True when this call created it."""
    while True:
        created = not path.is_dir()
        path.mkdir(parents=True, exist_ok=True)
        lock = path / _IN_USE
        f = open(lock, "a+b")  # noqa: SIM115 (held open, and locked, for the life of the process)
        if fcntl is not None:
            fcntl.flock(f, fcntl.LOCK_SH)
            try:
                same = os.stat(lock).st_ino == os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # removed by a prune between our open and our lock: make it again
                f.close()
                continue
        os.utime(lock)
        _HELD.append(f)
        return created


def _prune(current: Path) -> None:
    """Remove the cache folders beside `current` beyond the KEEP most recently used that no running
    process holds (without locks: those unused for MAX_AGE)."""
    base = current.parent
    for trash in base.glob(".archrun-trash-*"):
        shutil.rmtree(trash, ignore_errors=True)
    used = []
    for d in base.iterdir():
        if d != current and _FOLDER.fullmatch(d.name):
            try:
                used.append(((d / _IN_USE).stat().st_mtime, d))
            except OSError:
                continue  # not one of ours (ours get their `in-use` file first)
    used.sort(reverse=True)
    for last_use, d in used[KEEP - 1:]:
        try:
            with open(d / _IN_USE, "a+b") as f:
                if fcntl is not None:
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except OSError:
                        continue  # a running process uses it
                elif time.time() - last_use < MAX_AGE:
                    continue
                trash = base / f".archrun-trash-{uuid.uuid4().hex}"
                os.rename(d, trash)  # while locked: a process waiting for it finds it gone and makes it anew
            shutil.rmtree(trash, ignore_errors=True)
        except OSError:
            continue


def _forget_in_tree_cache(folder: Path) -> None:
    """Remove what earlier archrun versions cached beside the sources (numba's __pycache__ entries)."""
    stamp = folder / "__pycache__" / "archrun-kernels.stamp"
    if stamp.exists():
        for f in [*stamp.parent.glob("*.nbi"), *stamp.parent.glob("*.nbc"), stamp]:
            f.unlink(missing_ok=True)


def _private_folder() -> str:
    if not _PRIVATE:
        _PRIVATE.append(tempfile.mkdtemp(prefix="archrun-kernels-"))
        atexit.register(shutil.rmtree, _PRIVATE[0], True)
    return _PRIVATE[0]


def _install_locator() -> bool:
    """Put archrun's cache locator first in numba's list (for registered folders only)."""
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)  # renamed in numba 0.62
    base = getattr(caching, "_CacheLocator", None)
    if impl is None or base is None or not isinstance(getattr(impl, "_locator_classes", None), list):
        return False

    class KernelCacheLocator(base):
        """numba's cache locator for the kernels of folders registered with kernel_cache."""

        def __init__(self, py_func, path: str, stamp: bytes):
            self._lineno = py_func.__code__.co_firstlineno
            self._path, self._stamp = path, stamp

        def get_cache_path(self) -> str:
            return self._path

        def get_source_stamp(self) -> bytes:
            return self._stamp

        def get_disambiguator(self) -> str:
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func, py_file):
            file = os.path.realpath(py_file)
            sources = _REGISTERED.get(os.path.dirname(file))
            if sources is None and file.startswith(_CORE + os.sep):  # a kernel subpackage of the core
                sources = _REGISTERED[_CORE]
            if sources is None:
                return None  # not archrun's kernels: numba's own locators
            self = cls(py_func, *sources.location(file))
            try:
                self.ensure_cache_path()
            except OSError:
                self = cls(py_func, _private_folder(), self._stamp)
            return self

    if not any(c.__name__ == "KernelCacheLocator" for c in impl._locator_classes):
        impl._locator_classes = [KernelCacheLocator, *impl._locator_classes]
    return True


def _install_keyed_data_names() -> bool:
    """Name each cached entry's data file by a hash of its key, not by numba's counter.

    numba picks a new entry's data file name as the first number its index does not use; two
    processes adding different signatures of one kernel at once (test workers, a server and a
    script) then write both entries' code under one name, and an index read later points one
    signature at the other's machine code: a crash when it runs. With key-hashed names,
    concurrent writers never share a data file; an index update lost to a race costs one
    recompile. The data is written before the index names it.
    """
    from numba.core import caching

    cls = getattr(caching, "IndexDataCacheFile", None)
    if cls is None or not all(hasattr(cls, a) for a in ("_load_index", "_save_index", "_save_data", "_data_name")):
        return False
    if getattr(cls.save, "archrun_keyed", False):
        return True

    def save(self, key, data) -> None:
        name = self._load_index().get(key)
        if name is None:
            import pickle

            name = self._data_name(int(hashlib.sha256(pickle.dumps(key, protocol=4)).hexdigest()[:15], 16))
        self._save_data(name, data)
        overloads = self._load_index()  # re-read: keep what other processes added meanwhile
        if overloads.get(key) != name:
            overloads[key] = name
            self._save_index(overloads)

    save.archrun_keyed = True
    cls.save = save
    return True


def _install_reload_hooks() -> bool:
    """Keep the start-up hooks of cached code (numba's threading layer) with every library loaded from the cache.

    Loading a cached entry runs its `reload_init` hooks before its machine code is linked in; for code that
    contains a parallel loop, the hook starts numba's threading layer, which defines the symbols that code
    calls (numba_parallel_for, get_num_threads, ...). numba records the hooks of a kernel compiled in this
    process, and a caller inherits its callees' hooks when it links their code, but a callee loaded from
    the cache comes back without them: a caller compiled now over a cached parallel callee is cached with
    no hook. A later process that loads that caller before anything else started the threading layer
    fails to resolve those symbols, and the linker then leaves every external address of the object 0
    (PyArg_UnpackTuple included): a jump to address 0 on the first call (seen: the MoE kernel, whose
    product callees are parallel, crashing only after a dense model's process had written the cache).

    So a library rebuilt from the cache keeps its hooks (callers compiled over it inherit them again), and
    the threading layer is started before any cached code is linked, which also makes entries already
    cached without the hook safe.
    """
    from numba.core.compiler import CompileResult

    try:
        from numba.np.ufunc.parallel import _launch_threads
    except ImportError:
        return False
    rebuild = getattr(CompileResult, "_rebuild", None)
    if rebuild is None:
        return False
    if getattr(rebuild, "archrun_hooks", False):
        return True
    original = rebuild.__func__

    def _rebuild(cls, target_context, libdata, fndesc, env, signature, objectmode, lifted, typeann,
                 reload_init, referenced_envs):
        _launch_threads()  # idempotent; cheap once the layer runs
        result = original(cls, target_context, libdata, fndesc, env, signature, objectmode, lifted, typeann,
                          reload_init, referenced_envs)
        hooks = getattr(result.library, "_reload_init", None)
        if isinstance(hooks, set):
            hooks.update(reload_init or ())
        return result

    _rebuild.archrun_hooks = True
    CompileResult._rebuild = classmethod(_rebuild)
    return True


if not (_install_locator() and _install_keyed_data_names() and _install_reload_hooks()):
    # another numba: compile in every process rather than share a stale or racy cache
    JIT["cache"] = JIT_PAR["cache"] = False
_CORE = os.path.dirname(os.path.realpath(__file__))
_register(_CORE, ())
