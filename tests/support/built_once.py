"""A folder built once per test run, shared by every pytest-xdist worker."""

import os


def build_once(tmp_path_factory, name, build):
    """`build(folder)` once per test run, by whichever xdist worker asks first; the others wait for it, then
    use the same folder (what it holds is read, never changed, by the tests)."""
    import shutil

    from filelock import FileLock  # a dependency of huggingface_hub

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this run's folder, above each worker's own
    folder, done = root / "shared" / name, root / "shared" / f"{name}.done"
    folder.parent.mkdir(exist_ok=True)
    with FileLock(str(root / "shared" / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a worker that failed half-way left
            build(folder)
            done.touch()
    return folder
