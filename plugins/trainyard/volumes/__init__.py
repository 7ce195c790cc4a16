"""Dataset volumes: immutable snapshots, manifests, pointers, windows, verify, mirror, retention.

Layout (one volume per dataset; locally a directory under the volume root)::

    <volume_root>/<dataset>/snapshots/<snapshot_id>/   manifest.json + shards
    <volume_root>/<dataset>/intervals/<interval_key>.json
    <volume_root>/<dataset>/validated.json
    <volume_root>/<dataset>/.tmp/                      private in-progress writes

A snapshot directory is only ever created by renaming a complete, fsynced directory from
``.tmp/`` into ``snapshots/``, so readers never see a partial snapshot. Its id derives from
its content (the shard hashes and the contract version).

:mod:`.paths` names the folders, :mod:`.manifest` reads and lists snapshots,
:mod:`.pointers` holds what a dataset's records point at, :mod:`.window` the snapshots a
run trains on, :mod:`.integrity` verifies, records damage and mirrors, and
:mod:`.maintenance` keeps and collects them. Callers use ``trainyard.volumes.<name>``.
"""

from __future__ import annotations

from trainyard.volumes.integrity import (
    check_snapshot,
    clean_stale_tmp,
    clear_damage,
    mark_damaged,
    mirror_snapshot,
    recorded_damage,
    staging_area,
    verify_snapshot,
)
from trainyard.volumes.maintenance import (
    LEASE_TTL_S,
    active_leases,
    gc_snapshots,
    lease_snapshot,
    lease_window,
    protected_snapshots,
)
from trainyard.volumes.manifest import (
    Manifest,
    ShardInfo,
    compute_snapshot_id,
    data_shards,
    hash_file,
    list_datasets,
    list_snapshots,
    read_manifest,
    table_files,
)
from trainyard.volumes.paths import (
    DAMAGED,
    DATASET_RE,
    HASH_ALGO,
    MANIFEST,
    SNAPSHOT_RE,
    check_dataset_name,
    dataset_dir,
    snapshot_dir,
    tmp_root,
)
from trainyard.volumes.pointers import (
    CANONICAL_KEY,
    interval_key,
    latest_validated,
    mark_validated,
    read_interval,
    record_interval,
    refuse_interval,
    refused_intervals,
    replace_interval,
    replaced_snapshots,
    validation_state,
)
from trainyard.volumes.window import (
    data_until,
    drift_baseline,
    seen_text,
    training_window,
    window_entry,
    window_with_gaps,
)

__all__ = [
    "CANONICAL_KEY",
    "DAMAGED",
    "DATASET_RE",
    "HASH_ALGO",
    "LEASE_TTL_S",
    "MANIFEST",
    "SNAPSHOT_RE",
    "Manifest",
    "ShardInfo",
    "active_leases",
    "check_dataset_name",
    "check_snapshot",
    "clean_stale_tmp",
    "clear_damage",
    "compute_snapshot_id",
    "data_shards",
    "data_until",
    "dataset_dir",
    "drift_baseline",
    "gc_snapshots",
    "hash_file",
    "interval_key",
    "latest_validated",
    "lease_snapshot",
    "lease_window",
    "list_datasets",
    "list_snapshots",
    "mark_damaged",
    "mark_validated",
    "mirror_snapshot",
    "protected_snapshots",
    "read_interval",
    "read_manifest",
    "record_interval",
    "recorded_damage",
    "refuse_interval",
    "refused_intervals",
    "replace_interval",
    "replaced_snapshots",
    "seen_text",
    "snapshot_dir",
    "staging_area",
    "table_files",
    "tmp_root",
    "training_window",
    "validation_state",
    "verify_snapshot",
    "window_entry",
    "window_with_gaps",
]
