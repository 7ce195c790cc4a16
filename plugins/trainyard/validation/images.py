"""Decode every image of a files snapshot before a model is trained on it.

Staging reads only image headers (sizes for the index), so a file with a valid header and
a garbage body is staged; training would then die inside tf.data with an opaque error.
Validation decodes each sample once, streaming the tar shards, and names the first sample
that does not decode (key and shard).
"""

from __future__ import annotations

import io
import tarfile
import warnings
from pathlib import Path
from typing import Any

from trainyard.contracts import MAX_IMAGE_PIXELS
from trainyard.errors import SnapshotError, ValidationFailed


def check_images(snapshot: Path, manifest: Any, max_pixels: int = MAX_IMAGE_PIXELS) -> int:
    """Decode every image member of a files snapshot's tar shards.

    Args:
        snapshot: The snapshot directory.
        manifest: Its manifest (``volumes.Manifest``), already integrity-checked.
        max_pixels: Refuse images whose header claims more pixels than this.

    Returns:
        The number of images decoded.

    Raises:
        ValidationFailed: Naming the sample key and shard of the first image that is not
            decodable or claims more than ``max_pixels`` pixels.
        SnapshotError: If a shard is not a readable tar archive.
    """
    from PIL import Image

    sid = manifest.snapshot_id
    count = 0
    for shard in manifest.data_shards:
        path = Path(snapshot) / shard.path
        try:
            with tarfile.open(path, "r:") as tar:
                for member in tar:
                    key, _, ext = member.name.rpartition(".")
                    if not member.isfile() or ext == "cls":
                        continue
                    fh = tar.extractfile(member)
                    data = fh.read() if fh is not None else b""
                    problem = _decode_problem(Image, data, max_pixels)
                    if problem:
                        raise ValidationFailed(
                            f"snapshot {sid} of {manifest.dataset}: sample {key!r} in shard "
                            f"{shard.path}: {problem}"
                        )
                    count += 1
        except tarfile.TarError as e:
            raise SnapshotError(f"snapshot {sid} damaged: shard {shard.path}: {e}") from e
    return count


def _decode_problem(image_module: Any, data: bytes, max_pixels: int) -> str | None:
    """Why ``data`` is not a usable image, or None when it decodes in full."""
    if not data:
        return "image is empty (0 bytes)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", image_module.DecompressionBombWarning)
            with image_module.open(io.BytesIO(data)) as img:
                width, height = img.size
                if width * height > max_pixels:
                    return (
                        f"image header claims {width}x{height} pixels, more than the "
                        f"{max_pixels} allowed"
                    )
                img.load()
    except Exception as e:  # Pillow raises many types for broken data; all mean "corrupt"
        return f"image does not decode ({type(e).__name__}: {e})"
    return None
