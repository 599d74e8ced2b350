"""Jobs built on a loaded model, above the library's core: files of prompts (prompt_file.py, with the lock on
their output, output_lock.py), transformers' `pipeline("text-generation")` (pipeline.py), `edgelm bench`
(bench.py) and `edgelm bundle` (bundle.py)."""
