"""Files of prompts (`edgelm generate/score --input FILE --output FILE`, runtime/apps/prompt_file.py): every line
answered or reported, ids carried, an interrupted output resumed without redoing a line, another job's output
refused, nothing written ever lost, and the progress bar silent where stderr is not a terminal."""

import io
import json

import edgelm.runtime as rt
import pytest
from edgelm.runtime.apps import prompt_file
from edgelm.runtime.apps.prompt_file import PromptFile
from edgelm.runtime.cli.prompt_file import progress_bar
from prompt_files import GOOD, read_output, run, write_lines

TOO_LONG = "one two three four five six seven eight nine ten " * 4  # over the tiny model's 64 positions


def expected_text(model, record, max_new_tokens=5):
    options = {"max_new_tokens": max_new_tokens, **{k: v for k, v in record.items() if k not in ("prompt", "id")}}
    return model.generate([record["prompt"]], **options)[0].text


def test_every_line_is_answered_in_order_with_its_line_and_id(tiny_package, model, tmp_path):
    source = write_lines(tmp_path / "prompts.jsonl", [GOOD[0], GOOD[1], b"", GOOD[2], GOOD[3]])
    result = run("generate", "-m", tiny_package, "--input", source, "--output", tmp_path / "out.jsonl",
                 "--max-new-tokens", 5, "--batch-size", 2)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # results go to the file, the summary to stderr
    assert "4 lines answered" in result.stderr
    out = read_output(tmp_path / "out.jsonl")
    assert [o["line"] for o in out] == [1, 2, 4, 5]  # the blank line 3 is skipped, numbers are the file's own
    assert [o.get("id") for o in out] == ["first", None, 7, None]
    assert "id" not in out[1]
    for o, record in zip(out, [GOOD[0], GOOD[1], GOOD[2], GOOD[3]]):
        assert o["text"] == expected_text(model, record)
        assert o["finish_reason"] in ("stop", "length") and o["completion_tokens"] == len(o["token_ids"])
    assert out[1]["completion_tokens"] <= 3  # the line's own max_new_tokens
    assert len({o["job"] for o in out}) == 1


def test_bad_lines_are_reported_by_number_and_the_rest_answered(tiny_package, model, tmp_path):
    lines = [
        GOOD[0],
        b"not json",
        {"text": "no prompt here"},
        {"prompt": "x", "temprature": 0.5, "id": "typo"},
        {"prompt": "x", "max_new_tokens": 0},
        {"prompt": TOO_LONG},
        b'["a list"]',
        b'{"prompt": "\xff\xfe"}',
        {"prompt": [1, 99999]},
        {"prompt": "a", "messages": []},
        {"prompt": "a", "temperature": 10**400},  # past float's range: JSON allows it
        GOOD[2],
    ]
    source = write_lines(tmp_path / "prompts.jsonl", lines)
    out_path = tmp_path / "out.jsonl"
    result = run("generate", "-m", tiny_package, "--input", source, "--output", out_path, "--max-new-tokens", 5,
                 "--batch-size", 4)  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "10 of 12 lines failed (line 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)" in result.stderr
    out = {o["line"]: o for o in read_output(out_path)}
    assert sorted(out) == list(range(1, 13))
    errors = {n: o["error"] for n, o in out.items() if "error" in o}
    assert "not JSON" in errors[2]
    assert 'no "prompt"' in errors[3]
    assert "temprature" in errors[4] and out[4]["id"] == "typo"
    assert "max_new_tokens must be an integer >= 1" in errors[5]
    assert "64-token context" in errors[6]
    assert "not an object" in errors[7]
    assert "not valid UTF-8" in errors[8]
    assert "outside the vocabulary" in errors[9]
    assert "both" in errors[10]
    assert "temperature must be a number" in errors[11]
    for n in errors:
        assert f"line {n}: {errors[n]}" in result.stderr
    # the good lines shared batches with bad ones and are what they are alone
    assert out[1]["text"] == expected_text(model, GOOD[0]) and out[1]["id"] == "first"
    assert out[12]["text"] == expected_text(model, GOOD[2]) and out[12]["id"] == 7


def test_a_killed_run_resumes_without_redoing_finished_lines(tiny_package, model, tmp_path):
    source = write_lines(tmp_path / "prompts.jsonl", GOOD)
    whole = tmp_path / "whole.jsonl"
    assert (
        run("generate", "-m", tiny_package, "--input", source, "--output", whole, "--max-new-tokens", 5).exit_code == 0
    )
    data = whole.read_bytes()
    cut = data.index(b"\n", data.index(b"\n") + 1) + 1  # two whole lines, then half the third: a kill mid-write
    killed = tmp_path / "out.jsonl"
    killed.write_bytes(data[: cut + 20])

    job = PromptFile(model, source, killed, config=model.settings(max_new_tokens=5))
    assert job.answered == {1, 2} and job.total == 5
    assert killed.read_bytes() == data[:cut]  # the partial line is cut off at once
    steps = list(job.run(batch_size=2))
    assert [s.lines for s in steps] == [2, 1]  # lines 3 to 5 only
    assert job.written == 3
    assert killed.read_bytes() == data  # the same bytes as the uninterrupted run

    again = run("generate", "-m", tiny_package, "--input", source, "--output", killed, "--max-new-tokens", 5)
    assert again.exit_code == 0 and "(0 this run)" in again.stderr
    assert killed.read_bytes() == data


class FailingModel:
    """The model, except that running the third prompt fails as onnxruntime would."""

    def __init__(self, model):
        self.model = model

    def generate(self, prompts, *args, **kwargs):
        if GOOD[2]["prompt"] in prompts:
            raise rt.InferenceError("onnxruntime failed: out of memory")
        return self.model.generate(prompts, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def test_each_batch_is_on_disk_before_the_next_and_a_failure_keeps_it(model, tmp_path):
    source = write_lines(tmp_path / "prompts.jsonl", GOOD)
    out = tmp_path / "out.jsonl"
    job = PromptFile(FailingModel(model), source, out, config=model.settings(max_new_tokens=5))
    steps = job.run(batch_size=2)
    next(steps)
    assert [o["line"] for o in read_output(out)] == [1, 2]  # flushed before the next batch starts
    with pytest.raises(rt.InferenceError):
        next(steps)  # a model failure stops the job; the lines are not marked as failed
    assert [o["line"] for o in read_output(out)] == [1, 2]
    resumed = PromptFile(model, source, out, config=model.settings(max_new_tokens=5))
    assert resumed.answered == {1, 2}
    list(resumed.run(batch_size=2))
    assert [o["line"] for o in read_output(out)] == [1, 2, 3, 4, 5]
    assert "error" not in out.read_text()


def test_an_output_of_another_job_is_refused_unless_overwrite(tiny_package, tmp_path):
    source = write_lines(tmp_path / "prompts.jsonl", GOOD[:2])
    out = tmp_path / "out.jsonl"
    args = ("generate", "-m", tiny_package, "--input", source, "--output", out)
    assert run(*args, "--max-new-tokens", 5).exit_code == 0
    before = out.read_bytes()
    for changed in (
        args + ("--max-new-tokens", 4),
        args[:4] + (write_lines(tmp_path / "b.jsonl", GOOD[1:3]),) + args[5:],
    ):
        refused = run(*changed)
        assert refused.exit_code == 1
        assert "answers another job" in refused.output and "--overwrite" in refused.output
        assert out.read_bytes() == before  # refused before anything is written
    replaced = run(*args, "--max-new-tokens", 4, "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert out.read_bytes() != before and len(read_output(out)) == 2

    out.write_text("some notes\n")
    foreign = run(*args, "--max-new-tokens", 5)
    assert foreign.exit_code == 1 and "line 1 of" in foreign.output and "not a result" in foreign.output
    assert out.read_text() == "some notes\n"


def test_per_line_options_chat_and_several_sequences(model, tmp_path):
    messages = [{"role": "user", "content": "Hi there"}]
    lines = [
        {"prompt": "Once upon", "temperature": 0.7, "seed": 3},  # a sampling option turns sampling on
        {"prompt": "Once upon", "do_sample": True, "num_return_sequences": 2, "seed": 1},
        {"prompt": "The quick", "stop": ["e"], "logit_bias": {"5": 3.5}},
        {"messages": messages, "id": "chat"},
    ]
    out = tmp_path / "out.jsonl"
    list(
        PromptFile(model, write_lines(tmp_path / "p.jsonl", lines), out, config=model.settings(max_new_tokens=6)).run()
    )
    got = read_output(out)
    assert got[0]["text"] == model.generate("Once upon", max_new_tokens=6, do_sample=True, temperature=0.7, seed=3).text
    assert [c["text"] for c in got[1]["completions"]] == [
        c.text for c in model.generate("Once upon", max_new_tokens=6, do_sample=True, num_return_sequences=2, seed=1)
    ]
    assert got[2]["text"] == model.generate("The quick", max_new_tokens=6, stop=["e"], logit_bias={5: 3.5}).text
    assert got[3]["text"] == model.chat(messages, max_new_tokens=6).text and got[3]["id"] == "chat"


def test_score_files(tiny_package, model, tmp_path):
    lines = [{"text": "The quick brown fox", "id": 1}, {"prompt": [5, 6, 7], "top_logprobs": 2}, {"text": ""},
             {"text": "x", "temperature": 1}]  # fmt: skip
    out = tmp_path / "scores.jsonl"
    result = run("score", "-m", tiny_package, "--input", write_lines(tmp_path / "t.jsonl", lines), "--output", out)
    assert result.exit_code == 1, result.output
    assert "2 of 4 lines failed (line 3, 4)" in result.stderr
    got = read_output(out)
    first = model.score("The quick brown fox")
    assert got[0]["id"] == 1 and got[0]["logprobs"] == pytest.approx(first.logprobs)
    assert got[0]["perplexity"] == pytest.approx(first.perplexity) and "top_logprobs" not in got[0]
    assert got[1]["logprobs"][0] is None  # token ids: the first has nothing to be conditioned on (NaN in Python)
    assert got[1]["top_logprobs"][0] is None and len(got[1]["top_logprobs"][1]) == 2
    assert "non-empty" in got[2]["error"] and "temperature" in got[3]["error"]
    assert "NaN" not in out.read_text()


def test_score_one_text_prints_json(tiny_package, model):
    result = run("score", "-m", tiny_package, "The quick brown fox")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["perplexity"] == pytest.approx(model.score("The quick brown fox").perplexity)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--output", "o.jsonl"], "--output goes with --input"),
        (["--input", "p.jsonl"], "--input needs --output"),
        (["Hello", "--input", "p.jsonl", "--output", "o.jsonl"], "not both"),
        (["--input", "p.jsonl", "--output", "o.jsonl", "--json"], "--json is for one prompt"),
        (["--input", "p.jsonl", "--output", "o.jsonl", "--batch-size", "0"], "--batch-size"),
        (["--input", "missing.jsonl", "--output", "o.jsonl"], "missing.jsonl is not a file"),
        (["--input", "p.jsonl", "--output", "p.jsonl"], "the same file"),
        (["--input", "p.jsonl", "--output", "nowhere/o.jsonl"], "does not exist"),
    ],
)
def test_option_errors(tiny_package, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    write_lines(tmp_path / "p.jsonl", GOOD[:1])
    result = run("generate", "-m", tiny_package, *args)
    assert result.exit_code in (1, 2) and message in result.output, result.output
    assert "Traceback" not in result.output


def test_a_line_over_the_size_limit_is_reported_not_read(model, tmp_path, monkeypatch):
    monkeypatch.setattr(prompt_file, "MAX_LINE_BYTES", 64)
    source = write_lines(tmp_path / "p.jsonl", [{"prompt": "x" * 200}, GOOD[4]])
    job = PromptFile(model, source, tmp_path / "o.jsonl", config=model.settings(max_new_tokens=3))
    (step,) = job.run()
    assert [e.line for e in step.errors] == [1] and "over 64 bytes" in step.errors[0].message
    assert read_output(tmp_path / "o.jsonl")[1]["line"] == 2


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_bar_shows_only_on_a_terminal_without_quiet(tiny_package, tmp_path):
    for stream, quiet, shown in ((io.StringIO(), False, False), (Terminal(), False, True), (Terminal(), True, False)):
        with progress_bar(10, 4, quiet, stream) as bar:
            bar.update(6)
        assert ("10/10" in stream.getvalue()) is shown
    # through the command: CliRunner's stderr is not a terminal, so it holds the summary and nothing else
    source = write_lines(tmp_path / "p.jsonl", GOOD[:2])
    result = run("generate", "-m", tiny_package, "--input", source, "--output", tmp_path / "o.jsonl")
    assert result.exit_code == 0 and result.stderr.count("\n") == 1 and "\r" not in result.stderr
    quiet = run("generate", "-m", tiny_package, "--input", source, "--output", tmp_path / "o.jsonl", "--quiet")
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_two_runs_never_write_one_output_at_once(model, tmp_path):
    source = write_lines(tmp_path / "prompts.jsonl", GOOD)
    out = tmp_path / "out.jsonl"
    first = PromptFile(model, source, out, config=model.settings(max_new_tokens=5)).run(batch_size=2)
    next(first)  # holds the output, one batch written
    with pytest.raises(rt.PromptFileError, match="another run is writing"):
        PromptFile(model, source, out, config=model.settings(max_new_tokens=5))  # refused before it reads the output
    list(first)
    second = PromptFile(model, source, out, config=model.settings(max_new_tokens=5))
    list(second.run())  # now free: finds every line answered
    assert second.written == 0 and [o["line"] for o in read_output(out)] == [1, 2, 3, 4, 5]


def test_score_takes_a_text_not_a_package_and_says_so_in_its_own_name(tiny_package):
    result = run("score", tiny_package)
    assert result.exit_code == 2 and f"edgelm score -m {tiny_package}" in result.output
    empty = run("score", "-m", tiny_package, "")
    assert empty.exit_code == 1 and "non-empty" in empty.output and "Traceback" not in empty.output
