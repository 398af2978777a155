"""The files that travel with a job, and a stat cache that knows when none changed.

Theory of operation
-------------------
One call walks one package root in five steps (blocking: run it in a worker thread):

1. **Rules.** The layers of :mod:`kinetic._core.context_rules`: the defaults; inside a
   git work tree (a ``.git`` directory or file in the root or an ancestor)
   ``.git/info/exclude`` and the ``.gitignore`` files from the work tree's top down to
   the root, then each ``.gitignore`` the walk meets; ``.kineticignore`` at the root.
2. **Walk.** Depth first in ``os.walk`` order (a directory's files sorted by name, then
   its subdirectories sorted by name). Excluded directories, symlinked directories,
   virtualenvs (a directory holding ``pyvenv.cfg``) and the caller's excluded paths are
   not entered: a git-ignored ``data/`` costs one ``readdir`` entry, not a walk.
3. **Decide.** A directory whose own stat is the cached one has the cached listing (an
   entry added, removed or renamed changes its mtime); one whose listing (names and
   kinds) and rules are those cached reuses the cached decisions; otherwise the rules
   decide each entry. A warm walk neither lists a directory nor matches a pattern (nor
   imports :mod:`pathspec`).
4. **Stat.** The included files are ``stat``-ed relative to the directory's fd in
   C-level passes, and their stat keys (:mod:`kinetic._data.stat_cache`) packed.
5. **Compare.** Equal names and keys in every directory, the same directories, and a
   cached result give the context archive's content address without opening a file.

Stat cache
----------
One file per package root under
``${KINETIC_CACHE_DIR:-~/.kinetic/cache}/context-stat-cache-v3/``, in the checksummed
format of :mod:`kinetic._data.stat_cache`; its payload is ``(root, {dir relpath:
(names, kinds, rules signature, files decided, subdirs decided, files, packed keys,
the directory's packed key, names a secret pattern flagged)}, result)`` where ``result`` is ``(sha256, archive bytes)`` or ``None``. The decisions are
the rules' alone; the files are those that were then regular files and not excluded by
the caller. A file's key is cached only when
it proves something: a file changed less than a timestamp tick before it was
``stat``-ed (:func:`kinetic._core.content_hash.is_settled`), or one whose stat after it
was zipped differs from the walk's, is stored with a poisoned key that matches no real
stat, so the next walk rebuilds instead of trusting it. An edit therefore always
changes the content address, even within the same second and at the same size.

Limits: the proof rests on timestamps, as for Data hashing: a network filesystem whose
server clock runs far from ours can defeat it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from itertools import starmap
from operator import attrgetter
from pathlib import Path
from typing import Any

from kinetic._core import content_hash
from kinetic._core.context_rules import GITIGNORE, KINETICIGNORE, ExcludeRules, IgnoreFile
from kinetic._data import stat_cache
from kinetic._engine.tree_watch import TreeWatch

__all__ = ["ContextFile", "Scan", "largest_dirs", "list_context_files", "scan"]

_CACHE_SUBDIR = "context-stat-cache-v3"
_CACHE_MAGIC = b"kinetic-context-stat-cache-v3\n"
_OPEN_DIR = os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY
# A key no stat can have: what an unproven file is cached under.
_POISON = stat_cache.KEY_STRUCT.pack(-1, -1, -1, 0, 0)
_MTIME: Callable[[os.stat_result], int] = attrgetter("st_mtime_ns")
_CTIME: Callable[[os.stat_result], int] = attrgetter("st_ctime_ns")
_SIZE: Callable[[os.stat_result], int] = attrgetter("st_size")
_MODE: Callable[[os.stat_result], int] = attrgetter("st_mode")
_NLINK: Callable[[os.stat_result], int] = attrgetter("st_nlink")

# The widest racy window (coarse timestamps): a stat older than this proves itself.
_SURELY_SETTLED_NS = 2_000_000_000

# (names, kinds, rules signature, files decided, subdirs decided, files, packed keys,
#  the directory's own packed key, the names a secret pattern flagged: a directory's
#  with a trailing "/").
_Record = tuple[list[str], str, bytes, list[str], list[str], list[str], bytes, bytes, list[str]]
_Tree = dict[str, _Record]
_Result = tuple[str, int]


@dataclass(frozen=True)
class ContextFile:
    """One file that travels: its path in the archive, on disk, and its stat."""

    relpath: str
    path: Path
    size: int
    mtime_ns: int
    mode: int
    key: bytes = field(default=b"", repr=False)  # the packed stat key the walk saw


@dataclass(slots=True)
class _Dir:
    rel: str
    abs: str
    record: _Record
    stats: list[os.stat_result]
    changed: bool  # its files or their keys differ from the cache


class Scan:
    """The outcome of one walk: what travels, and whether the cache already knows it."""

    def __init__(
        self,
        root: Path,
        dirs: list[_Dir],
        cache: _Cache | None,
        result: _Result | None,
        listing_changed: bool,
    ) -> None:
        self.root = root
        self._dirs = dirs
        self._cache = cache
        self._result = result
        self._listing_changed = listing_changed
        self.watched = False
        """Every change to what travels is seen by the walk's watch from now on."""
        self.file_count = sum(len(d.record[5]) for d in dirs)
        self.total_bytes = sum(sum(map(_SIZE, d.stats)) for d in dirs)

    def secrets(self) -> tuple[list[str], list[str]]:
        """The paths a secret pattern matched (:data:`~kinetic._core.context_rules.SECRET_EXCLUDES`):
        those left out, and those ``.kineticignore`` keeps on purpose (a directory's path
        ends in ``/``)."""
        left_out: list[str] = []
        kept: list[str] = []
        for d in self._dirs:
            prefix = f"{d.rel}/" if d.rel else ""
            decided = {*d.record[3], *d.record[4]}
            for name in d.record[8]:
                (kept if name.rstrip("/") in decided else left_out).append(prefix + name)
        return left_out, kept

    @property
    def cached_result(self) -> _Result | None:
        """``(sha256, archive bytes)`` of this very tree, when the cache proves it."""
        return self._result

    def files(self) -> list[ContextFile]:
        """The files in archive order (each directory's files, then its subdirectories)."""
        out: list[ContextFile] = []
        for d in self._dirs:
            prefix = f"{d.rel}/" if d.rel else ""
            keys = d.record[6]
            for i, (name, st) in enumerate(zip(d.record[5], d.stats, strict=True)):
                k = i * stat_cache.KEY_LEN
                out.append(
                    ContextFile(
                        prefix + name,
                        Path(d.abs, name),
                        st.st_size,
                        st.st_mtime_ns,
                        st.st_mode,
                        keys[k : k + stat_cache.KEY_LEN],
                    )
                )
        return out

    def sizes(self) -> Iterable[tuple[str, int]]:
        """``(relpath, size)`` of every file, without building :class:`ContextFile` objects."""
        for d in self._dirs:
            prefix = f"{d.rel}/" if d.rel else ""
            for name, st in zip(d.record[5], d.stats, strict=True):
                yield prefix + name, st.st_size

    def save(self, result: _Result | None, unproven: Iterable[str] = ()) -> bool:
        """Remember this walk and the archive built from it; return whether it was written.

        :param unproven: relpaths whose bytes, as zipped, may not match the walk's stat:
            their keys are poisoned.
        """
        if self._cache is None:
            return False
        poisoned = set(unproven)
        tree: _Tree = {}
        for d in self._dirs:
            names, kinds, sig, decided, subdirs, files, keys, dir_key, flagged = d.record
            if poisoned:
                prefix = f"{d.rel}/" if d.rel else ""
                hit = [i for i, n in enumerate(files) if prefix + n in poisoned]
                if hit:
                    parts = bytearray(keys)
                    for i in hit:
                        k = i * stat_cache.KEY_LEN
                        parts[k : k + stat_cache.KEY_LEN] = _POISON
                    keys = bytes(parts)
            tree[d.rel] = (names, kinds, sig, decided, subdirs, files, keys, dir_key, flagged)
        if result == self._result and not self._listing_changed and not poisoned:
            return False  # nothing new to remember
        return self._cache.save(tree, result)


def scan(
    root: Path,
    *,
    exclude: tuple[Path, ...] = (),
    use_cache: bool = True,
    clock: Callable[[], int] = time.time_ns,
    watch: TreeWatch | None = None,
) -> Scan:
    """Walk ``root`` (the package root, resolved) as the module docstring says. Blocking.

    :param exclude: absolute paths left out besides the rules (local data shipped
        separately, Kinetic's own local storage when it sits inside the root).
    :param use_cache: read and keep the stat cache (off: list only, remember nothing).
    :param clock: the wall clock in ns (tests pass their own to stage a racy edit).
    :param watch: watch each directory entered, and those of the ignore files that
        decide the rules, before reading them (:mod:`kinetic._engine.tree_watch`);
        :attr:`Scan.watched` says whether that covers every change to what travels.
    """
    root = Path(os.path.realpath(root))
    # Kinetic's own caches never travel, even when they sit inside the project.
    skip = _relative_excludes(root, (*exclude, stat_cache.cache_base()))
    watched = watch is not None and _watch_rule_sources(watch, root)
    cache = _Cache.load(root) if use_cache else None
    old = cache.tree if cache is not None else {}
    rules = root_rules(root)
    git = rules.git_mode
    dirs: list[_Dir] = []
    listing_changed = False
    stack: list[tuple[str, ExcludeRules]] = [("", rules.rules)]
    while stack:
        rel, dir_rules = stack.pop()
        abs_dir = f"{root}/{rel}" if rel else str(root)
        try:
            fd = os.open(abs_dir, _OPEN_DIR | (os.O_NOFOLLOW if rel else 0))
        except OSError:
            continue  # vanished or unreadable since its parent was listed
        try:
            now = clock()
            cached = old.get(rel)
            dir_st = os.fstat(fd)
            wd = watch.add(abs_dir, dir_st.st_dev) if watched and watch is not None else None
            watched = wd is not None
            dir_key = stat_cache.KEY_STRUCT.pack(*stat_cache.STAT_KEY(dir_st))
            if cached is not None and cached[7] == dir_key:
                # No entry was added, removed or renamed since: the listing holds.
                names, kinds = cached[0], cached[1]
            else:
                names, kinds = _listing(fd)
            if "l" in kinds or not content_hash.is_settled(
                dir_st.st_mtime_ns, dir_st.st_ctime_ns, now
            ):
                # A link's target can change kind unseen, and a racy stat proves nothing.
                dir_key = _POISON
            if rel and "pyvenv.cfg" in names:
                if wd is not None and watch is not None:
                    watch.mute(wd)  # installs into it change nothing that travels
                continue  # a virtualenv, whatever its name
            if git and GITIGNORE in names:
                text = _read_text(fd, GITIGNORE)
                if text is not None:
                    source = f"{rel}/{GITIGNORE}" if rel else GITIGNORE
                    dir_rules = dir_rules.nested(IgnoreFile(source, tuple(text), scope=rel))
            sig = dir_rules.signature
            if (
                cached is not None
                and cached[0] == names
                and cached[1] == kinds
                and cached[2] == sig
            ):
                decided, decided_dirs, flagged = cached[3], cached[4], cached[8]
            else:
                decided, decided_dirs, flagged = _decide(rel, names, kinds, dir_rules)
                listing_changed = True
            files, subdirs = decided, decided_dirs
            if skip:
                prefix = f"{rel}/" if rel else ""
                files = [n for n in files if prefix + n not in skip]
                subdirs = [n for n in subdirs if prefix + n not in skip]
            files, sts = _stat_files(fd, files)
            if wd is not None and watch is not None:
                if _changes_unseen(names, kinds, files, sts):
                    watched = False
                else:
                    watch.quiet(wd, _quiet_names(names, kinds, decided))
            keys = b"".join(starmap(stat_cache.KEY_STRUCT.pack, map(stat_cache.STAT_KEY, sts)))
            changed = cached is None or cached[5] != files or cached[6] != keys
            stored = keys if _all_settled(sts, now) else _poison_unsettled(sts, keys, now)
            record = (names, kinds, sig, decided, decided_dirs, files, stored, dir_key, flagged)
            dirs.append(_Dir(rel, abs_dir, record, sts, changed))
        finally:
            os.close(fd)
        for name in reversed(subdirs):
            stack.append((f"{rel}/{name}" if rel else name, dir_rules))
    changed = any(d.changed for d in dirs) or len(dirs) != len(old)
    result = None if changed or cache is None else cache.result
    scanned = Scan(root, dirs, cache, result, listing_changed or changed)
    scanned.watched = watched
    return scanned


def _changes_unseen(
    names: list[str], kinds: str, files: list[str], sts: list[os.stat_result]
) -> bool:
    """Whether a travelling file can change without an event in its directory: a
    symlink's target, or a file with other hard links, is written elsewhere."""
    if max(map(_NLINK, sts), default=1) > 1:
        return True
    if "s" not in kinds:
        return False
    links = {n for n, k in zip(names, kinds, strict=True) if k == "s"}
    return not links.isdisjoint(files)


def _quiet_names(names: list[str], kinds: str, travelling: list[str]) -> list[str]:
    """The files of a directory whose content never matters: they do not travel, and
    they are no ignore file."""
    going = set(travelling)
    return [
        n
        for n, k in zip(names, kinds, strict=True)
        if k == "f" and n not in going and n not in (GITIGNORE, KINETICIGNORE)
    ]


def _watch_rule_sources(watch: TreeWatch, root: Path) -> bool:
    """Watch the directories above ``root`` whose ignore files (or ``.git``, whose
    appearance makes a work tree) decide its rules; return whether all could be."""
    top = _git_work_tree(root)
    watched: list[tuple[Path, tuple[str, ...]]] = []
    if top is None:
        watched = [(d, (".git",)) for d in root.parents]
    else:
        above = [root.parent, *root.parent.parents] if root != top else []
        watched = [(d, (GITIGNORE, ".git")) for d in above[: len(root.relative_to(top).parts)]]
        git_dir = _git_dir(top)
        watched.append((top, (GITIGNORE, ".git")))
        watched.append((git_dir, ("info",)))
        watched.append((git_dir / "info", ("exclude",)))
    for directory, names in watched:
        try:
            dev = os.stat(directory).st_dev
        except FileNotFoundError:
            continue  # .git/info may not exist: its creation is seen in .git
        except OSError:
            return False
        if watch.add(str(directory), dev, only=names) is None:
            return False
    return True


def list_context_files(root: Path, *, exclude: tuple[Path, ...] = ()) -> list[ContextFile]:
    """The files that travel with a job, in archive order; stat only, no reads. Blocking."""
    return scan(Path(root), exclude=exclude, use_cache=False).files()


def largest_dirs(sizes: Iterable[tuple[str, int]], n: int = 3) -> list[tuple[str, int, int]]:
    """The ``n`` top-level directories holding the most bytes: ``(name/, bytes, files)``."""
    totals: dict[str, list[int]] = {}
    for rel, size in sizes:
        top, sep, _ = rel.partition("/")
        if sep:
            entry = totals.setdefault(top + "/", [0, 0])
            entry[0] += size
            entry[1] += 1
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))
    return [(name, b, f) for name, (b, f) in ranked[:n]]


# -- rules ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RootRules:
    """The rules in force at the package root, and whether it is in a git work tree."""

    rules: ExcludeRules
    git_mode: bool
    work_tree: Path | None


def root_rules(root: Path) -> RootRules:
    """Read the ignore files that apply at ``root`` (but not the ones inside it). Blocking."""
    kinetic_lines = _read_lines(root / KINETICIGNORE)
    kinetic = IgnoreFile(KINETICIGNORE, kinetic_lines) if kinetic_lines is not None else None
    top = _git_work_tree(root)
    if top is None:
        return RootRules(ExcludeRules((), kinetic), False, None)
    down = root.relative_to(top).parts
    prefix = "".join(f"{part}/" for part in down)
    layers: list[IgnoreFile] = []
    exclude_lines = _read_lines(_git_dir(top) / "info" / "exclude")
    if exclude_lines is not None:
        layers.append(IgnoreFile(".git/info/exclude", exclude_lines, prefix=prefix))
    for depth in range(len(down)):  # the .gitignore files above the root, top first
        here = top.joinpath(*down[:depth])
        lines = _read_lines(here / GITIGNORE)
        if lines is not None:
            rest = "".join(f"{part}/" for part in down[depth:])
            layers.append(IgnoreFile(str(here / GITIGNORE), lines, prefix=rest))
    if layers and _root_is_ignored(layers, down):
        # The project sits in a git-ignored directory of a bigger repository: those
        # rules would leave out all of it. Only the .gitignore files inside it apply.
        layers = []
    return RootRules(ExcludeRules(layers, kinetic), True, top)


def _root_is_ignored(layers: list[IgnoreFile], down: tuple[str, ...]) -> bool:
    """Whether ``layers`` (the git rules above the root) ignore the root or a directory
    between it and the work tree's top (``down``: the root's path from that top)."""
    for depth in range(1, len(down) + 1):
        verdict: bool | None = None
        for layer in reversed(layers):
            own = len(down) - layer.prefix.count("/")  # depth of the layer's own directory
            if own >= depth:
                continue  # not above this directory
            sub = "/".join(down[own:depth])
            verdict = IgnoreFile(layer.source, layer.lines).check(sub, is_dir=True)
            if verdict is not None:
                break
        if verdict:
            return True
    return False


def _git_work_tree(root: Path) -> Path | None:
    for candidate in (root, *root.parents):
        with contextlib.suppress(OSError):
            os.lstat(candidate / ".git")
            return candidate
    return None


def _git_dir(top: Path) -> Path:
    """The directory holding ``info/exclude`` (worktrees and submodules have a ``.git`` file)."""
    dot_git = top / ".git"
    if dot_git.is_dir():
        return dot_git
    text = _read_lines(dot_git) or ()
    for line in text:
        if line.startswith("gitdir:"):
            gitdir = (top / line.removeprefix("gitdir:").strip()).resolve()
            common = _read_lines(gitdir / "commondir")
            if common:
                return (gitdir / common[0].strip()).resolve()
            return gitdir
    return dot_git


def _read_lines(path: Path) -> tuple[str, ...] | None:
    try:
        return tuple(path.read_text(encoding="utf-8", errors="surrogateescape").splitlines())
    except (OSError, ValueError):
        return None


def _read_text(dir_fd: int, name: str) -> list[str] | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            return f.read().decode("utf-8", "surrogateescape").splitlines()
        except OSError:
            return None


# -- walk ----------------------------------------------------------------------------


def _relative_excludes(root: Path, exclude: tuple[Path, ...]) -> frozenset[str]:
    out = set()
    for p in exclude:
        try:
            rel = Path(p).resolve().relative_to(root).as_posix()
        except (ValueError, OSError):
            continue
        if rel != ".":
            out.add(rel)
    return frozenset(out)


def _listing(fd: int) -> tuple[list[str], str]:
    """A directory's names, sorted, and their kinds: ``d`` directory, ``s`` a symlink to
    a file (or dangling), ``f`` anything else, ``l`` a symlink to a directory (not
    entered)."""
    entries: list[tuple[str, str]] = []
    with os.scandir(fd) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                kind = "d"
            elif entry.is_symlink():
                try:
                    kind = "l" if entry.is_dir() else "s"
                except OSError:
                    kind = "s"  # dangling: dropped when stat-ed
            else:
                kind = "f"
            entries.append((entry.name, kind))
    entries.sort()
    return [n for n, _ in entries], "".join(k for _, k in entries)


def _decide(
    rel: str, names: list[str], kinds: str, rules: ExcludeRules
) -> tuple[list[str], list[str], list[str]]:
    """The files and subdirectories that travel, and the names a secret pattern
    flagged (left out, or kept by ``.kineticignore``; a directory's ending in ``/``)."""
    prefix = f"{rel}/" if rel else ""
    files: list[str] = []
    subdirs: list[str] = []
    flagged: list[str] = []
    for name, kind in zip(names, kinds, strict=True):
        if kind not in "fsd":
            continue
        is_dir = kind == "d"
        excluded, secret = rules.flags_secret(prefix + name, is_dir=is_dir)
        if secret:
            flagged.append(name + "/" if is_dir else name)
        if not excluded:
            (subdirs if is_dir else files).append(name)
    return files, subdirs, flagged


def _stat_files(fd: int, names: list[str]) -> tuple[list[str], list[os.stat_result]]:
    """Stat ``names`` (following symlinks) in one C-level pass; keep the regular files."""
    stat_at = partial(os.stat, dir_fd=fd)
    try:
        sts = list(map(stat_at, names))
    except OSError:
        kept_names: list[str] = []
        sts = []
        for name in names:
            try:
                st = stat_at(name)
            except OSError:
                continue  # vanished since listed, or a dangling symlink
            kept_names.append(name)
            sts.append(st)
        names = kept_names
    if all(map(stat.S_ISREG, map(_MODE, sts))):
        return names, sts
    pairs = [(n, st) for n, st in zip(names, sts, strict=True) if stat.S_ISREG(st.st_mode)]
    return [n for n, _ in pairs], [st for _, st in pairs]


def _all_settled(sts: list[os.stat_result], now: int) -> bool:
    """The common case, decided in C-level passes: nothing changed in the last 2 s."""
    if not sts:
        return True
    return max(max(map(_MTIME, sts)), max(map(_CTIME, sts))) + _SURELY_SETTLED_NS <= now


def _poison_unsettled(sts: list[os.stat_result], keys: bytes, now: int) -> bytes:
    parts = bytearray(keys)
    for i, st in enumerate(sts):
        if not content_hash.is_settled(st.st_mtime_ns, st.st_ctime_ns, now):
            k = i * stat_cache.KEY_LEN
            parts[k : k + stat_cache.KEY_LEN] = _POISON
    return bytes(parts)


# -- cache file ----------------------------------------------------------------------

_LOADED: dict[Path, tuple[tuple[int, int, int], _Tree, _Result | None]] = {}
_LOADED_LOCK = threading.Lock()


class _Cache:
    """The stat cache file of one package root (format in the module docstring)."""

    def __init__(self, file: Path, root: str, tree: _Tree, result: _Result | None) -> None:
        self.file = file
        self.root = root
        self.tree = tree
        self.result = result

    @classmethod
    def load(cls, root: Path) -> _Cache:
        file = stat_cache.cache_file(stat_cache.cache_base() / _CACHE_SUBDIR, f"context\0{root}")
        try:
            st = os.stat(file)
            ident = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            return cls(file, str(root), {}, None)
        with _LOADED_LOCK:
            memo = _LOADED.get(file)
        if memo is not None and memo[0] == ident:
            return cls(file, str(root), memo[1], memo[2])
        tree, result = _parse(stat_cache.read_blob(file, _CACHE_MAGIC), str(root))
        with _LOADED_LOCK:
            _LOADED[file] = (ident, tree, result)
        return cls(file, str(root), tree, result)

    def save(self, tree: _Tree, result: _Result | None) -> bool:
        ok = stat_cache.write_blob(
            self.file, _CACHE_MAGIC, (self.root, tree, result), what="context stat cache"
        )
        if ok:
            with contextlib.suppress(OSError), _LOADED_LOCK:
                st = os.stat(self.file)
                _LOADED[self.file] = ((st.st_mtime_ns, st.st_size, st.st_ino), tree, result)
        return ok


def _parse(obj: Any, root: str) -> tuple[_Tree, _Result | None]:
    if not (isinstance(obj, tuple) and len(obj) == 3 and obj[0] == root):
        return {}, None
    tree, result = obj[1], obj[2]
    if not isinstance(tree, dict):
        return {}, None
    for record in tree.values():
        if not (
            type(record) is tuple
            and len(record) == 9
            and type(record[7]) is bytes
            and type(record[8]) is list
            and type(record[0]) is list
            and type(record[1]) is str
            and type(record[2]) is bytes
            and type(record[3]) is list
            and type(record[4]) is list
            and type(record[5]) is list
            and type(record[6]) is bytes
            and len(record[6]) == stat_cache.KEY_LEN * len(record[5])
        ):
            return {}, None
    if not (
        result is None
        or (
            type(result) is tuple
            and len(result) == 2
            and type(result[0]) is str
            and type(result[1]) is int
        )
    ):
        result = None
    return tree, result
