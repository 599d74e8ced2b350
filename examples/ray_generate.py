"""A file of prompts across a Ray cluster: each worker loads the package once, then answers batches of lines.

    pip install 'edgelm[ray]'
    python examples/ray_generate.py prompts.jsonl results/ -m models/distilgpt2 --concurrency 2 --max-new-tokens 30

The lines are those of `edgelm generate --input` ({"prompt": ...} or {"messages": [...]}, an optional "id", any
generation option by its Python name), answered by the same code (edgelm.runtime.apps.prompt_file.generate_records):
each output row is its input row plus the answer's fields (text, finish_reason, token_ids, ...; "error" for a
line that cannot be run, which does not stop the others). Ray writes `results/` as one JSON-lines file per
block. What differs from `edgelm generate --input` on one machine:

- Ray parses the input with pyarrow: a line that is not JSON stops the job, and a column must keep one type
  (every "prompt" a string, or every one a list of token ids).
- Rows carry no input line number (Ray does not know it): give each line an "id" to join results to prompts.
- No resume: Ray retries a failed task itself; a job stopped part-way is run again from the start.

Each worker is one Ray actor holding one onnxruntime session; give it the cores it should use with
--cpus-per-worker (onnxruntime's intra-op threads are set to match).
"""

import argparse


class Generate:
    """The map_batches callable: loads the package once (per Ray actor), then answers one batch per call.
    A batch is a pyarrow Table (batch_format="pyarrow") or a dict of equal-length columns; the answer has the
    same form, each row the input row plus its answer's fields."""

    def __init__(self, package: str, threads: int | None = None, **options):
        import edgelm.runtime as edgelm

        self.model = edgelm.load(package, threads=threads)
        self.config = self.model.settings(**options)  # options given once for every line, checked here

    def __call__(self, batch):
        from edgelm.runtime.apps.prompt_file import generate_records

        table = hasattr(batch, "to_pylist")
        rows = batch.to_pylist() if table else [dict(zip(batch, values)) for values in zip(*batch.values())]
        # pyarrow fills a key a line does not have with null: an absent option, not an option set to None
        records = [{key: value for key, value in row.items() if value is not None} for row in rows]
        answered = [{**row, **answer} for row, answer in zip(rows, generate_records(self.model, self.config, records))]
        if table:
            return type(batch).from_pylist(answered)
        keys = list(dict.fromkeys(key for row in answered for key in row))
        return {key: [row.get(key) for row in answered] for key in keys}


def run(input_path, output_folder, package, concurrency=1, batch_size=16, cpus_per_worker=1, **options):
    """Read `input_path` (JSON lines), answer every line on `concurrency` workers, write `output_folder`."""
    import sys

    import ray
    from ray import cloudpickle

    if __name__ != "__main__":  # imported, not run: Generate travels to the workers by value, not by module name
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # Reading and writing take no core of their own: with every core held by a worker (concurrency times
    # cpus_per_worker equal to the cluster's), a reader that waits for a free core would wait for ever.
    dataset = ray.data.read_json(input_path, ray_remote_args={"num_cpus": 0})
    answered = dataset.map_batches(
        Generate,
        fn_constructor_args=(str(package), cpus_per_worker),
        fn_constructor_kwargs=options,
        batch_format="pyarrow",
        batch_size=batch_size,
        concurrency=concurrency,
        num_cpus=cpus_per_worker,
    )
    answered.write_json(str(output_folder), ray_remote_args={"num_cpus": 0})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", help="a file of JSON lines (or a folder of them)")
    parser.add_argument("output", help="the folder Ray writes the results to")
    parser.add_argument("-m", "--model", required=True, help="the package folder (every worker must see it)")
    parser.add_argument("--concurrency", type=int, default=1, help="workers, each with the model loaded once")
    parser.add_argument("--batch-size", type=int, default=16, help="lines per call of a worker")
    parser.add_argument("--cpus-per-worker", type=int, default=1, help="cores per worker (its onnxruntime threads)")
    parser.add_argument("--max-new-tokens", type=int, help="for every line without its own max_new_tokens")
    parser.add_argument("--address", help="a running Ray cluster (ray start --head); default: a local one")
    args = parser.parse_args()

    import ray

    ray.init(address=args.address)
    options = {"max_new_tokens": args.max_new_tokens} if args.max_new_tokens else {}
    run(args.input, args.output, args.model, args.concurrency, args.batch_size, args.cpus_per_worker, **options)


if __name__ == "__main__":
    main()
