"""What is stored for an array, object by object, with a version of each: one listing.

The chunk cache (``store.cache.array_token``: an array rewritten in place gets new
keys) and the resume of a write (``fingerprints.stored_fingerprint``: a changed
input is refused) both need to know whether any stored object of an array changed
since they last looked.  :func:`object_versions` is that one look:

- a local directory: an ``os.stat`` of every file below the array (size,
  modification time in ns and inode: zarr writes an object to a new file and
  renames it, so a rewrite changes the inode);
- an fsspec store: one listing of the prefix (``find(detail=True)``, fsspec's
  listing cache cleared first), each object's size and ETag, last-modified date
  or mtime;
- an obstore ``ObjectStore``: one listing (a request per 1,000 objects), each
  object's size and ETag or last-modified date;
- a zip store: the zip file's size and modification time;
- anything else (in-memory and wrapper stores): ``None``, the store cannot tell
  cheaply (the callers say what they do then).
"""

from __future__ import annotations

import os
from typing import Any

import zarr
import zarr.storage

__all__ = ["blocking_fs", "object_versions"]

#: ``(key, size, version)`` of one stored object.
Version = tuple[str, int, str]


def object_versions(store: Any, array: zarr.Array) -> list[Version] | None:
    """``(key, size, version)`` of every object stored under ``array`` on ``store``, sorted.

    ``store`` is the array's store without its wrappers.  ``None`` where the
    store cannot list versions (see the module's docstring).
    """
    path = array.store_path.path.strip("/")
    prefix = f"{path}/" if path else ""
    rows: list[Version] = []
    if isinstance(store, zarr.storage.LocalStore):
        root = os.path.join(str(store.root), path)
        for folder, _, files in os.walk(root):
            for name in files:
                where = os.path.join(folder, name)
                try:
                    stat = os.stat(where)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # deleted while listed
                key = os.path.relpath(where, root)
                rows.append((key, stat.st_size, f"{stat.st_mtime_ns}-{stat.st_ino}"))
    elif isinstance(store, zarr.storage.FsspecStore):
        where = f"{store.path.rstrip('/')}/{prefix}"
        fs = blocking_fs(store.fs)
        fs.invalidate_cache(where)  # a listing of now, not one fsspec kept
        for name, info in fs.find(where, detail=True).items():
            version = info.get("ETag") or info.get("LastModified") or info.get("mtime")
            rows.append((str(name), int(info.get("size") or 0), str(version)))
    elif type(store).__name__ == "ObjectStore":
        import obstore

        for batch in obstore.list(store.store, prefix=prefix or None):
            for meta in batch:
                version = meta.get("e_tag") or meta.get("last_modified")
                rows.append((str(meta["path"]), int(meta["size"]), str(version)))
    elif isinstance(store, zarr.storage.ZipStore):
        stat = os.stat(str(store.path))
        rows.append((str(store.path), stat.st_size, str(stat.st_mtime_ns)))
    else:
        return None
    return sorted(rows)


def blocking_fs(fs: Any) -> Any:
    """An fsspec file system like ``fs`` whose blocking methods work from any thread.

    Zarr's ``FsspecStore`` holds an asynchronous one (its blocking methods
    raise "Loop is not running"); fsspec caches instances by their
    arguments, so this is made once per set of options.
    """
    if not getattr(fs, "asynchronous", False):
        return fs
    inner = getattr(fs, "sync_fs", None)  # a blocking file system wrapped for Zarr
    if inner is not None:
        return inner
    return type(fs)(**{**fs.storage_options, "asynchronous": False})
