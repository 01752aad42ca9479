"""The one writer of prepared datasets: every producer (the embedded dataset, the GMM dataset, the clustering of
data at scale, a dataset extended by a late cluster, an institution-owned data descriptor) writes through
:class:`DatasetWriter`, in the layout of :mod:`hddm_flower.data.layout`."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..safeio import write_atomic
from .layout import META, SHARD_GLOB, SHARD_PATTERN, UNCOND, cluster_dir

if TYPE_CHECKING:
    from torch import Tensor


class DatasetWriter:
    """Writes one dataset directory ``out``: every file goes into a temporary folder beside ``out``, which is
    renamed to ``out`` when the ``with`` block completes and removed if anything in it fails, so a reader never
    sees a partial dataset. ``out`` may exist only as an empty folder, unless ``replace`` (a descriptor written
    again): then the finished folder takes the old one's place.

    ::

        with DatasetWriter(out) as w:
            with w.shard_writer(k, maxcount=1000) as shards: ...
            w.write_uncond(states, mask)
            w.write_meta(meta)          # meta.json, and each cluster-k/ its own meta.json and uncond copy
    """

    def __init__(self, out: str | os.PathLike, *, replace: bool = False):
        self.out, self.replace = Path(out), replace
        self.tmp: Path | None = None

    def __enter__(self) -> DatasetWriter:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", dir=self.out.parent))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None:
                self._finish()
        finally:
            if self.tmp.exists():  # failed (or the rename did): nothing partial stays behind
                shutil.rmtree(self.tmp, ignore_errors=True)
        return False

    def _finish(self) -> None:
        old = None
        if self.out.is_dir() and any(self.out.iterdir()):
            if not self.replace:
                raise FileExistsError(f"{self.out} exists and is not empty")
            old = self.out.with_name(f".{self.out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.out, old)
        elif self.out.is_dir():
            self.out.rmdir()
        os.replace(self.tmp, self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def path(self, name: str) -> Path:
        """A file of the dataset outside the layout's own (features, a report, a grid, the GMM's parameters)."""
        return self.tmp / name

    def cluster_dir(self, k: int) -> Path:
        """Cluster ``k``'s folder, created on first use."""
        folder = cluster_dir(self.tmp, k)
        folder.mkdir(exist_ok=True)
        return folder

    def shard_writer(self, k: int, *, maxcount: int):
        """A webdataset ``ShardWriter`` into cluster ``k``'s folder, ``maxcount`` samples a shard."""
        import webdataset as wds

        return wds.ShardWriter(str(self.cluster_dir(k) / SHARD_PATTERN), maxcount=maxcount, verbose=0)

    def shard_names(self, k: int) -> list[str]:
        """The names of the shards written so far into cluster ``k``'s folder, sorted."""
        return sorted(p.name for p in cluster_dir(self.tmp, k).glob(SHARD_GLOB))

    def link_cluster(self, k: int, target: Path) -> None:
        """Cluster ``k`` as a link to another dataset's shard set ``target`` (nothing copied)."""
        cluster_dir(self.tmp, k).symlink_to(target, target_is_directory=True)

    def link_shard(self, k: int, url: str | os.PathLike) -> None:
        """A link to the shard ``url`` inside cluster ``k``'s folder."""
        (self.cluster_dir(k) / Path(url).name).symlink_to(url)

    def write_uncond(self, states: Tensor, mask: Tensor) -> None:
        """The empty caption's text states ``(L, dim)`` and mask ``(L,)``."""
        from safetensors.torch import save_file

        save_file({"states": states.contiguous(), "mask": mask.contiguous()}, self.tmp / UNCOND)

    def copy_uncond(self, source_dir: str | os.PathLike) -> None:
        """The empty caption's states as another folder (an encoded or prepared dataset) holds them."""
        shutil.copy(Path(source_dir) / UNCOND, self.tmp / UNCOND)

    def write_meta(self, meta: dict, *, clusters: Iterable[int] | None = None, also: Iterable[str] = ()) -> None:
        """``meta.json``; and in each of ``clusters`` (default: every cluster folder written) its own ``meta.json``
        (``cluster_set: k``) with copies of ``uncond.safetensors`` and of the files ``also`` names, so that each
        shard set stands alone (an institution needs only its own folder)."""
        (self.tmp / META).write_text(json.dumps(meta, indent=2))
        if clusters is None:
            clusters = range(meta["num_clusters"])
        for k in clusters:
            folder = cluster_dir(self.tmp, k)
            (folder / META).write_text(json.dumps(meta | {"cluster_set": k}, indent=2))
            for name in (UNCOND, *also):
                shutil.copy(self.tmp / name, folder / name)


def rewrite_meta(root: str | os.PathLike, meta: dict) -> None:
    """Replace a finished dataset's ``meta.json`` atomically (e.g. marking one institution's own data)."""
    write_atomic(Path(root) / META, json.dumps(meta, indent=2))
