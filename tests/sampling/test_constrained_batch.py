"""Constrained rows among others: a different constraint (or none) per prompt in one Model.batch, per job in the
continuous-batching scheduler, with n > 1 and seeds; each row gets what it gets alone. And the two doors a user
opens from outside: `edgelm generate --json-schema/--json-object/--regex/--grammar/--choice`, and prompt-file
lines that carry any of them by their Python name."""

import json
import re

import jsonschema
import llguidance  # noqa: F401  (the test extra has it: without it these tests fail, never skip)
import pytest
from click.testing import CliRunner
from edgelm.runtime.batching.scheduler import Scheduler
from edgelm.runtime.cli.main import main
from edgelm.runtime.errors import GenerationOptionError
from scheduler_job import Job

POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"enum": ["a", "b"]}},
    "required": ["x", "y"],
    "additionalProperties": False,
}
# one constraint (or none) per prompt, and what a valid output of each looks like
ROWS = [
    (dict(json_schema=POINT), lambda text: jsonschema.validate(json.loads(text), POINT) is None),
    (dict(), lambda text: True),
    (dict(regex="[0-9]{2}-[a-z]{2}"), lambda text: re.fullmatch("[0-9]{2}-[a-z]{2}", text) is not None),
    (dict(choices=["left", "right"]), lambda text: text in ("left", "right")),
    (dict(json_object=True), lambda text: isinstance(json.loads(text), dict)),
    (dict(grammar='start: "<" WORD ">"\nWORD: /[a-z]{1,4}/'), lambda text: re.fullmatch("<[a-z]{1,4}>", text)),
]
PROMPTS = ["Hi", "The quick brown", "Once", "Numbers: 0 1", "A", "import"]


def alone(model, prompt, options, **common):
    return model.generate([prompt], **options, **common)


@pytest.mark.parametrize("sampled", [False, True])
def test_one_batch_with_a_constraint_per_prompt(model, sampled):
    common = (
        dict(max_new_tokens=30, do_sample=True, seed=4, num_return_sequences=2) if sampled else dict(max_new_tokens=30)
    )
    configs = [model.settings(**options, **common) for options, _ in ROWS]
    completions = model.generate(PROMPTS, config=configs)
    n = 2 if sampled else 1
    assert len(completions) == len(ROWS) * n
    for k, ((options, valid), prompt) in enumerate(zip(ROWS, PROMPTS)):
        mine = completions[k * n : (k + 1) * n]
        assert [c.text for c in mine] == [c.text for c in alone(model, prompt, options, **common)]
        for c in mine:
            assert c.constraint == (next(iter(options)) if options else None)
            if c.finish_reason == "stop" and options:
                assert valid(c.text), (options, c.text)


def test_settings_of_one_batch_may_differ_in_their_constraint_only(model):
    with pytest.raises(GenerationOptionError, match="differ in their constraint only"):
        model.generate(["a", "b"], config=[model.settings(regex="a"), model.settings(max_new_tokens=3)])
    with pytest.raises(GenerationOptionError, match="one settings object per prompt"):
        model.generate(["a", "b"], config=[model.settings(regex="a")])


def test_the_running_batch_gives_each_constrained_job_what_it_gets_alone(model):
    """Jobs with different constraints (and none) join one running batch at different steps, sampled and greedy;
    each gets exactly its tokens alone."""
    scheduler = Scheduler(model, max_rows=4)
    common = [dict(max_new_tokens=24), dict(max_new_tokens=24, do_sample=True, seed=7, num_return_sequences=2)]
    cases = [(prompt, options, common[k % 2]) for k, (prompt, (options, _)) in enumerate(zip(PROMPTS, ROWS))]
    jobs = []

    def submit_rest(count):  # later jobs join while the first ones run
        if count == 2:
            for prompt, options, extra in cases[2:]:
                jobs.append(Job(model.batch([prompt], **options, **extra)))
                scheduler.submit(jobs[-1])

    first = [Job(model.batch([p], **o, **e), at_boundary=submit_rest if k == 0 else None) for k, (p, o, e) in
             enumerate(cases[:2])]  # fmt: skip
    jobs[:0] = first
    for job in first:
        scheduler.submit(job)
    for job in first:
        job.wait()
    scheduler.close()
    assert len(jobs) == len(cases)
    for job, (prompt, options, extra) in zip(jobs, cases):
        assert job.wait().error is None
        expected = alone(model, prompt, options, **extra)
        assert [c.text for c in job.batch.completions] == [c.text for c in expected], options
        assert [c.parsed for c in job.batch.completions] == [c.parsed for c in expected]


def test_a_bad_constraint_in_the_running_batch_ends_its_job_only(model, monkeypatch):

    scheduler = Scheduler(model, max_rows=4)
    good = Job(model.batch(["Hi"], choices=["yes", "no"], max_new_tokens=5))
    bad = Job(model.batch(["Hi"], regex="[a-z]{3}", max_new_tokens=5))
    failing = bad.batch.rows.constraint  # its rows' matchers fail at their first token, as a step over its limits would

    def broken(row):
        row_constraint = failing(row)
        row_constraint.matcher = None
        return row_constraint

    monkeypatch.setattr(bad.batch.rows, "constraint", broken)
    scheduler.submit(bad)
    scheduler.submit(good)
    assert isinstance(bad.wait().error, Exception)
    assert good.wait().error is None and good.batch.completions[0].text in ("yes", "no")
    scheduler.close()


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_the_command_line_options(tiny_package, tmp_path):
    schema = tmp_path / "point.json"
    schema.write_text(json.dumps(POINT))
    for given in (schema, json.dumps(POINT)):
        result = invoke("generate", "-m", tiny_package, "--json", "--json-schema", given, "--max-new-tokens", 30, "Hi")
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout)
        assert out["constraint"] == "json_schema" and out["parsed"] == json.loads(out["text"])
    result = invoke("generate", "-m", tiny_package, "--choice", "yes", "--choice", "no", "Is it?")
    assert result.exit_code == 0 and result.stdout.strip() in ("yes", "no")
    result = invoke("generate", "-m", tiny_package, "--regex", "[0-9]{4}", "Year:")
    assert result.exit_code == 0 and re.fullmatch("[0-9]{4}", result.stdout.strip())
    result = invoke("generate", "-m", tiny_package, "--json", "--json-object", "--max-new-tokens", 40, "Hi")
    out = json.loads(result.stdout)
    assert out["constraint"] == "json_object" and (out["finish_reason"] == "length" or isinstance(out["parsed"], dict))
    lark = tmp_path / "tag.lark"
    lark.write_text('start: "<" WORD ">"\nWORD: /[a-z]{1,4}/')
    result = invoke("generate", "-m", tiny_package, "--grammar", lark, "Hi")
    assert result.exit_code == 0 and re.fullmatch("<[a-z]{1,4}>", result.stdout.strip())


@pytest.mark.parametrize(
    "args, words",
    [
        (["--regex", "a("], "regex is invalid"),
        (["--json-schema", "missing.json"], "neither a JSON schema nor a file"),
        (["--json-schema", "x" * 300], "neither a JSON schema nor a file"),  # a name too long to look up
        (["--json-schema", '{"type": "strang"}'], "strang"),
        (["--regex", "a", "--choice", "a"], "at most one constraint"),
        (["--grammar", "missing.lark"], "does not exist"),
        (["--choice", "a much longer answer than fits", "--max-new-tokens", "2"], "raise max_new_tokens"),
    ],
)
def test_bad_command_line_constraints_are_one_line(tiny_package, args, words):
    result = invoke("generate", "-m", tiny_package, *args, "Hi")
    assert result.exit_code != 0 and words in result.output and "Traceback" not in result.output


def test_prompt_file_lines_carry_constraints_by_their_python_names(tiny_package, model, tmp_path):
    lines = [
        {"prompt": "Hi", "json_schema": POINT, "id": "point"},
        {"prompt": "Is it?", "choices": ["yes", "no"]},
        {"prompt": "Year:", "regex": "[0-9]{4}"},
        {"prompt": "Hi"},
        {"prompt": "Hi", "regex": "a("},
        {"prompt": "Hi", "json_object": True, "max_new_tokens": 40},
    ]
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = invoke("generate", "-m", tiny_package, "--input", source, "--output", tmp_path / "out.jsonl",
                    "--max-new-tokens", 30, "--quiet")  # fmt: skip
    assert result.exit_code == 1 and "1 of 6 lines failed (line 5)" in result.output
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert out[0]["id"] == "point" and out[0]["parsed"] == json.loads(out[0]["text"])
    jsonschema.validate(out[0]["parsed"], POINT)
    assert out[1]["parsed"] == out[1]["text"] in ("yes", "no")
    assert re.fullmatch("[0-9]{4}", out[2]["text"]) and out[2]["constraint"] == "regex"
    assert "parsed" not in out[3] and "constraint" not in out[3]  # an unconstrained line's result is as before
    assert "regex is invalid" in out[4]["error"]
    assert out[5]["constraint"] == "json_object"
    for record, answer in zip(lines[:4], out[:4]):
        options = {k: v for k, v in record.items() if k not in ("prompt", "id")}
        assert answer["text"] == model.generate([record["prompt"]], max_new_tokens=30, **options)[0].text
