"""storage: every shared path (`cluster.shared_paths`) is one writable filesystem on every node, with room.

A checkpoint directory that is the NFS/Lustre mount on 63 nodes and a plain local directory on the
64th (the mount failed at boot) works until the job restarts and rank 57 cannot find its shard.

Two phases (Check.prepare):
1. the head writes a random token into `<path>/.preflight-shared-token` on each shared path (a fixed
   name, overwritten by each run: nothing accumulates; it is left in place because the other nodes
   read it concurrently in phase 2 and no single one of them can know it is the last reader);
2. every node (the head too) reads the head's token there, creates, fsyncs and removes a file of its
   own (`.preflight-write-<random>`), and reports the mount the path lives on (/proc/self/mountinfo)
   and its free space (statvfs f_bavail: what an unprivileged writer can use).

Rule decisions: no `cluster.shared_paths`: SKIP with that reason. Per node and path: missing or not a
directory, the head's token absent or different (not the same filesystem as the head's), not writable,
or free space below `expect.shared_free_gib`: FAIL (action fix_config: mount it / fix permissions /
free space). The head's own failure to write the token is reported on the head, and the other nodes
are then not tested (ERROR). A filesystem type that differs from the majority is named in the message.

Facts (phase 2): {"paths": [{"path", "exists", "is_dir", "mount": {"mount_point", "fstype", "source"}|None,
                   "free_bytes", "total_bytes", "writable": bool, "write_error": str|None,
                   "token": "match"|"differs"|"missing"|"error: ..."}]}
"""

from __future__ import annotations

from preflight.model import Check, Setting

NAME = "storage"

CHECK = Check(
    name=NAME,
    claim="Every cluster.shared_paths entry is the same writable filesystem on every node (a token the head "
    "writes is read by all), with the free space expect.shared_free_gib asks for",
    why="A checkpoint or dataset path that is a local directory on one node (its NFS/Lustre mount failed) "
    "lets the job start and then lose or never find that rank's shards; a full or read-only share kills "
    "the job at its first checkpoint.",
    fix="Mount the shared filesystem on the named node (findmnt PATH; check /etc/fstab or the automounter and "
    "`mount -a`), fix its permissions for the job's user, or free space on it.",
    phase=2,
    action="fix_config",
    reads="/proc/self/mountinfo, statvfs and one small written, fsynced and removed file per shared path",
    takes="< 1 s (the filesystem's latency)",
    order=87,
    settings=(
        Setting("shared_paths", "paths", "directories every node must see as one writable filesystem", default=()),
        Setting("expect.shared_free_gib", "number", "free space each shared path must have", low=0, high=10 ** 9, unit="GiB"),
    ),
)
