"""Where a process's memory goes, stage by stage: resident now, of which mapped files, and peak so far (VmRSS,
RssFile, VmHWM).

    python benchmarks/rss_stages.py benchmarks/out/pkg-int8

Imports, the tokenizer, the onnxruntime session (the pieces edgelm.runtime.load puts together), then, in a
fresh process, edgelm.runtime.load itself and a 512-token prompt with 128 tokens. Linux only.
"""

import re
import subprocess
import sys


def memory() -> str:
    status = open("/proc/self/status").read()
    now, peak, files = (
        int(re.search(key + r":\s+(\d+)", status).group(1)) / 1024 for key in ("VmRSS", "VmHWM", "RssFile")
    )
    return f"resident {now:4.0f} MB ({files:4.0f} MB of mapped files), peak {peak:4.0f} MB"


def main():
    package = sys.argv[1]
    print(f"{'python started':<34} {memory()}")
    import edgelm.runtime  # noqa: F401  (what every edgelm process imports)
    from edgelm.runtime.engine.session import create_session, release_freed_memory
    from edgelm.runtime.package.open import open_package
    from tokenizers import Tokenizer

    print(f"{'numpy, onnxruntime, edgelm imported':<34} {memory()}")
    opened = open_package(package)
    tokenizer = Tokenizer.from_file(str(opened.tokenizer_file))  # noqa: F841 (alive: its memory is the figure)
    print(f"{'tokenizer.json parsed':<34} {memory()}")
    release_freed_memory()
    print(f"{'  freed memory returned':<34} {memory()}")
    session, _ = create_session(opened.model_file, "cpu")
    print(f"{'onnxruntime session':<34} {memory()}")
    release_freed_memory()
    print(f"{'  freed memory returned':<34} {memory()}")
    print("a fresh process:", flush=True)
    subprocess.run([sys.executable, __file__, package, "--generate"], check=True)


def generate(package):
    import edgelm.runtime as edgelm
    from harness import prompt_ids, timed_tokens

    model = edgelm.load(package, device="cpu")
    print(f"{'  edgelm.runtime.load':<34} {memory()}")
    timed_tokens(model, [prompt_ids(model, 512)], 128)
    print(f"{'  512-token prompt, 128 tokens':<34} {memory()}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    generate(sys.argv[1]) if "--generate" in sys.argv else main()
