"""A data directory on S3-compatible object storage: :class:`ObjectPath`, a path on a
bucket."""

from __future__ import annotations

import fnmatch
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # DuckDB and Polars only for readers: the collector never loads them (RSS)
    pass
from fleetlens.pipeline.storage import fence
from fleetlens.pipeline.storage.base import URL_SCHEME
from fleetlens.pipeline.storage.s3settings import (
    S3Settings,
    export_s3_settings,
    resolve_s3_settings,
    split_url,
)

# -- objects ---------------------------------------------------------------------------

# A data directory on S3-compatible object storage: :class:`ObjectPath`, a path on a bucket.
#
# :class:`ObjectPath` answers the part of :class:`pathlib.Path` that fleetlens uses on its data
# directory (``/``, ``name``, ``parent``, ``relative_to``, ``exists``, ``stat``, ``glob``,
# ``read_bytes``, ``unlink``...), so the code above the storage layer does not care where the
# data is. What differs underneath:
#
# * Publishing is one PUT of the whole object: S3 never shows a partial object, so no temporary
#   name and no rename are needed (a rename is a copy and a delete there, not atomic).
# * Folders do not exist: ``mkdir`` does nothing, a folder "exists" while an object is under it.
# * A listing carries each object's size and time, so :meth:`ObjectPath.stat` of a listed path
#   costs no request (discovery stats every raw segment).
# * Versioned writes (:meth:`ObjectPath.read_versioned`, :meth:`ObjectPath.put_if`) are S3's
#   conditional PUT (``If-None-Match: *`` to create, ``If-Match: <etag>`` to replace): the state
#   files and the job lease use them so that two writers cannot overwrite each other unseen.
#
# obstore does the requests (measured against s3fs in docs/benchmarks.md); it is imported only
# when an ``s3://`` data directory is opened, so a local data directory never loads it.

class ObjectStoreError(OSError):
    """A request to the object store failed (network, permissions, server): an I/O error,
    so callers that retry a failed publish on ``OSError`` retry this too."""


class VersionConflict(ObjectStoreError):
    """A conditional write lost: the object changed (or appeared) since it was read."""


@dataclass(frozen=True)
class ObjectStat:
    """What ``os.stat_result`` fields fleetlens reads, for an object."""

    st_size: int
    st_mtime: float

    @property
    def st_mtime_ns(self) -> int:
        return int(self.st_mtime * 1e9)


class Bucket:
    """One bucket's obstore client (thread-safe) and its request count."""

    def __init__(self, settings: S3Settings) -> None:
        from obstore.store import S3Store

        self.settings = settings
        self.name = settings.bucket
        self.store = S3Store(settings.bucket, **settings.obstore_config())  # type: ignore[arg-type]
        self.requests = 0
        self._count_lock = threading.Lock()
        self._fs: Any = None

    def _count(self) -> None:
        with self._count_lock:
            self.requests += 1

    def get(self, key: str) -> tuple[bytes, str | None]:
        """The object's bytes and ETag. Raises FileNotFoundError when there is none."""
        import obstore

        self._count()
        with _mapped(key):
            result = obstore.get(self.store, key)
            return bytes(result.bytes()), result.meta.get("e_tag")

    def head(self, key: str) -> dict[str, Any]:
        import obstore

        self._count()
        with _mapped(key):
            return dict(obstore.head(self.store, key))

    def put(self, key: str, data: bytes, mode: Any = None) -> str | None:
        """One PUT; ``mode`` is obstore's (``"create"``, ``{"e_tag": ...}``). Returns the ETag."""
        import obstore

        self._count()
        with _mapped(key):
            result = obstore.put(self.store, key, data, mode=mode or "overwrite")
        return result.get("e_tag")

    def delete(self, keys: list[str]) -> None:
        import obstore

        for start in range(0, len(keys), 1000):  # S3's DeleteObjects takes 1,000 keys
            self._count()
            with _mapped(keys[start] if keys else ""):
                obstore.delete(self.store, keys[start:start + 1000])

    def list(self, prefix: str) -> Iterator[dict[str, Any]]:
        """Every object under ``prefix`` (a folder: ends with ``/``), page by page."""
        import obstore

        stream = obstore.list(self.store, prefix or None, chunk_size=1000)
        while True:
            self._count()
            with _mapped(prefix):
                try:
                    chunk = next(stream)
                except StopIteration:
                    return
            yield from chunk

    def filesystem(self) -> Any:
        """An s3fs filesystem on the same settings, for DuckDB's ``register_filesystem``
        (obstore's fsspec adapter fails on S3 options in 0.12, see docs/benchmarks.md)."""
        if self._fs is None:
            import s3fs

            self._fs = s3fs.S3FileSystem(**self.settings.s3fs_options())
        return self._fs


class _mapped:
    """Turn obstore's errors into the OSErrors the rest of fleetlens handles."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 _tb: Any) -> bool:
        if error is None or isinstance(error, FileNotFoundError | ObjectStoreError):
            return False  # obstore's NotFoundError is already a FileNotFoundError
        import obstore.exceptions as ox

        if isinstance(error, ox.AlreadyExistsError | ox.PreconditionError):
            raise VersionConflict(f"{self.key}: changed by another writer") from None
        if isinstance(error, ox.BaseError):
            first = str(error).split("\n", 1)[0]
            raise ObjectStoreError(f"object store request failed: {first}") from None
        return False


@functools.cache
def bucket_client(name: str) -> Bucket:
    """The process's client of bucket ``name`` (settings resolved once, from the environment
    and the AWS files, and exported to the environment for libraries that read it)."""
    settings = resolve_s3_settings(name)
    export_s3_settings(settings)
    return Bucket(settings)


class ObjectPath:
    """A path in a bucket: ``s3://bucket/key``. Keys have no leading or trailing ``/``."""

    remote = True
    __slots__ = ("bucket", "key", "_stat", "_folder_known")

    def __init__(self, where: Bucket, key: str, stat: ObjectStat | None = None,
                 folder: bool | None = None) -> None:
        self.bucket = where
        self.key = key
        self._stat = stat
        #: Whether a listing found this path as a folder (True) or an object (False).
        self._folder_known = True if folder else (False if stat is not None else None)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        # Pickled as bucket name and key (a Ray task gets the DataDir): the client, its locks
        # and connections stay here, and the other process opens its own from its settings.
        return _object_path, (self.bucket.name, self.key)

    @classmethod
    def from_url(cls, url: str) -> ObjectPath:
        """The path of an ``s3://bucket/prefix`` URL.

        Raises:
            ValueError: a malformed URL (see :func:`split_url`).
        """
        name, key = split_url(url)
        return cls(bucket_client(name), key)

    # -- pure path operations ------------------------------------------------------------
    def __str__(self) -> str:
        return f"{URL_SCHEME}{self.bucket.name}/{self.key}".rstrip("/")

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __lt__(self, other: ObjectPath) -> bool:
        return self.parts < other.parts  # by component, as pathlib sorts

    def __truediv__(self, other: str | PurePosixPath) -> ObjectPath:
        parts = [p for p in str(other).split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ValueError(f"'.' and '..' are not allowed in an object key: {other}")
        return ObjectPath(self.bucket, "/".join(filter(None, [self.key, *parts])))

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(p for p in self.key.split("/") if p)

    @property
    def name(self) -> str:
        return self.key.rpartition("/")[2]

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def parent(self) -> ObjectPath:
        return ObjectPath(self.bucket, self.key.rpartition("/")[0])

    def with_name(self, name: str) -> ObjectPath:
        return self.parent / name

    def relative_to(self, other: ObjectPath) -> PurePosixPath:
        if other.key and not (self.key == other.key or self.key.startswith(other.key + "/")):
            raise ValueError(f"{self} is not under {other}")
        return PurePosixPath(self.key[len(other.key):].lstrip("/") or ".")

    def is_relative_to(self, other: ObjectPath) -> bool:
        try:
            self.relative_to(other)
        except ValueError:
            return False
        return self.bucket.name == other.bucket.name

    def resolve(self) -> ObjectPath:
        return self  # keys are normalised when made

    def expanduser(self) -> ObjectPath:
        return self

    # -- requests ------------------------------------------------------------------------
    def _folder(self) -> str:
        return f"{self.key}/" if self.key else ""

    def stat(self) -> ObjectStat:
        """Size and time: from the listing that found this path, else one HEAD.

        Raises:
            FileNotFoundError: no such object.
        """
        if self._stat is None:
            meta = self.bucket.head(self.key)
            self._stat = ObjectStat(int(meta["size"]), meta["last_modified"].timestamp())
        return self._stat

    def is_file(self) -> bool:
        try:
            self.stat()
        except FileNotFoundError:
            return False
        return True

    def is_dir(self) -> bool:
        """Whether any object lies under this path (folders exist only through objects)."""
        if self._folder_known is not None:
            return self._folder_known
        return next(self.bucket.list(self._folder()), None) is not None

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: a folder appears with its first object."""

    def read_bytes(self) -> bytes:
        return self.bucket.get(self.key)[0]

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> int:
        """Publish ``data`` with one PUT (readers see the old object or the whole new one).

        Raises:
            LeaseLost: this process lost the job lease of the data directory (:mod:`.fence`).
        """
        fence.check(self)
        self.bucket.put(self.key, data)
        import time

        self._stat = ObjectStat(len(data), time.time())  # what a HEAD would say, unasked
        return len(data)

    def read_versioned(self) -> tuple[bytes, str | None]:
        """The bytes and the version (ETag) to pass to :meth:`put_if`."""
        return self.bucket.get(self.key)

    def current_version(self) -> str | None:
        """The object's version now (one HEAD), None when there is no object."""
        try:
            return self.bucket.head(self.key).get("e_tag")
        except FileNotFoundError:
            return None

    def put_if(self, data: bytes, version: str | None) -> str | None:
        """PUT only if the object is still at ``version`` (None: only if there is none).

        Returns:
            The new version.
        Raises:
            VersionConflict: another writer changed or created it first.
        """
        mode = "create" if version is None else {"e_tag": version}
        new = self.bucket.put(self.key, data, mode=mode)
        self._stat = None
        return new

    def unlink(self, missing_ok: bool = False) -> None:
        fence.check(self)  # a job that lost its lease deletes nothing either
        if not missing_ok:
            self.stat()  # FileNotFoundError as for a file (S3's DELETE of nothing succeeds)
        self.bucket.delete([self.key])
        self._stat = None  # gone: the next stat asks the store

    def files(self) -> Iterator[ObjectPath]:
        """Every object under this folder, with its size and time (no further request)."""
        for meta in self.bucket.list(self._folder()):
            stat = ObjectStat(int(meta["size"]), meta["last_modified"].timestamp())
            yield ObjectPath(self.bucket, meta["path"], stat)

    def remove_tree(self) -> int:
        """Delete every object under this folder; returns how many."""
        fence.check(self)
        keys = [p.key for p in self.files()]
        if keys:
            self.bucket.delete(keys)
        return len(keys)

    def glob(self, pattern: str) -> Iterator[ObjectPath]:
        """Objects and folders under this one matching ``pattern`` (``*``, ``**``), sorted."""
        wanted = [p for p in pattern.split("/") if p]
        found: dict[str, ObjectPath] = {}
        for obj in self.files():
            rel = obj.relative_to(self).parts
            for depth in range(1, len(rel) + 1):
                if _match(rel[:depth], wanted):
                    key = "/".join([*self.parts, *rel[:depth]])
                    found.setdefault(key, obj if depth == len(rel)
                                     else ObjectPath(self.bucket, key, folder=True))
        return iter(sorted(found.values()))

    def rglob(self, pattern: str) -> Iterator[ObjectPath]:
        return self.glob(f"**/{pattern}")

    def iterdir(self) -> Iterator[ObjectPath]:
        return self.glob("*")


def _object_path(bucket: str, key: str) -> ObjectPath:
    """An unpickled :class:`ObjectPath`: this process's client of the bucket."""
    return ObjectPath(bucket_client(bucket), key)


def _match(parts: tuple[str, ...], pattern: list[str]) -> bool:
    """Whether path ``parts`` match glob ``pattern`` components (``**``: any depth)."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _match(
        parts[1:], pattern[1:])
