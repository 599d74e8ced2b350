"""Work folders in the store and what killed processes leave of them. Each is named for its process (PREFIX +
pid, then anything), so two processes never share one, and one whose process is gone is swept, or, for a pull
that resumes, taken over by the next process that needs it."""

import os
import sys
from pathlib import Path


def remove_tree(folder: Path) -> None:
    """Remove `folder` and everything in it, as far as it can be removed (what is left, the next sweep finds)."""
    import shutil  # only here: bz2 and lzma come with it, and a load removes nothing

    shutil.rmtree(folder, ignore_errors=True)


def sweep_dead(root: Path, prefixes) -> None:
    """Remove the folders named PREFIX<pid>-... under root whose process is gone (killed, or the machine stopped)."""
    for prefix in prefixes:
        for entry in root.glob(f"{prefix}*"):
            pid = entry.name[len(prefix) :].split("-")[0]
            if pid.isdigit() and not alive(int(pid)):
                remove_tree(entry)


def take_over(root: Path, prefix: str) -> Path:
    """root/PREFIX<this pid>: if it does not exist yet, a PREFIX<pid> folder whose process is gone is renamed to
    it (one step, so only one process takes a folder over), else it is left for the caller to make."""
    mine = root / f"{prefix}{os.getpid()}"
    if not mine.exists():
        for left in sorted(root.glob(f"{prefix}*")):
            pid = left.name[len(prefix) :]
            if pid.isdigit() and not alive(int(pid)):
                try:
                    os.rename(left, mine)
                    return mine
                except OSError:
                    continue
    return mine


def alive(pid: int) -> bool:
    if pid == os.getpid() or sys.platform == "win32":  # on Windows signal 0 is CTRL_C_EVENT, not a probe
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: leave its folder alone
    return True
