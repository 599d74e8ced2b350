"""The Python API's errors as a user meets them: bad options, prompts, devices and thread counts, each a typed error
with a clear message, every error class a public name; and load() building the tokenizer while a thread creates the
session, whose errors come as one after the other gave them, with no thread left behind."""

import edgelm.runtime as rt
import onnxruntime as ort
import pytest
from edgelm.runtime import DeviceError, GenerationOptionError, PackageError, PromptError
from pass_counter import count_passes


# --- bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, error, fragment",
    [
        ({"temperature": -1.0, "do_sample": True}, GenerationOptionError, "temperature must be a number >= 0"),
        ({"top_p": 0.0}, GenerationOptionError, "top_p must be in (0, 1]"),
        ({"top_p": 1.5}, GenerationOptionError, "top_p must be in (0, 1]"),
        ({"top_k": -1}, GenerationOptionError, "top_k must be an integer >= 0"),
        ({"min_p": 2}, GenerationOptionError, "min_p must be in [0, 1]"),
        ({"max_new_tokens": 0}, GenerationOptionError, "max_new_tokens must be an integer >= 1"),
        ({"temprature": 0.5}, GenerationOptionError, "unknown generation option(s): temprature"),
        ({"logit_bias": {100000: 5.0}}, GenerationOptionError, "outside this model's vocabulary"),
        ({"num_return_sequences": 0}, GenerationOptionError, "num_return_sequences"),
        ({"do_sample": True, "temperature": 0}, GenerationOptionError, "do_sample=False"),
        ({"stop": [""]}, GenerationOptionError, "stop must be"),
        ({"max_new_tokens": 64}, PromptError, "leaves no room for a prompt"),
    ],
)
def test_bad_options_raise_a_clear_error(model, options, error, fragment):
    with pytest.raises(error) as raised:
        model.generate("Hello", **options)
    assert fragment in str(raised.value)


def test_bad_options_fail_before_any_work(model, monkeypatch):
    calls = count_passes(model, monkeypatch)
    with pytest.raises(GenerationOptionError):
        model.stream("Hello", top_p=0)
    with pytest.raises(GenerationOptionError):
        model.generate(["Hello", "Hi"], top_k=-1)
    assert calls == []
    model.generate("Hello", max_new_tokens=3, ignore_eos=True)
    assert len(calls) == 3  # the counter sees work: the prompt, then two decode steps


@pytest.mark.parametrize(
    "prompt, fragment",
    [
        ([[5, 100000]], "token id 100000 is outside the vocabulary"),
        ([[5, -1]], "token id -1 is outside the vocabulary"),
        ([["5"]], "outside the vocabulary"),
        ([], "no prompts"),
    ],
)
def test_bad_token_ids_raise_prompt_error(model, prompt, fragment):
    with pytest.raises(PromptError) as raised:
        model.generate(prompt, max_new_tokens=3)
    assert fragment in str(raised.value)


def test_prompt_too_long_raises_prompt_error(model):
    with pytest.raises(PromptError, match="Shorten the prompt") as raised:
        model.generate("Numbers: 0 1 2 3 4 5 6 7 8 9, and symbols !? ;: " * 5, max_new_tokens=5)
    assert "--truncate" in str(raised.value)
    with pytest.raises(PromptError, match="Score it in parts"):
        model.score("Numbers: 0 1 2 3 4 5 6 7 8 9, and symbols !? ;: " * 5)
    with pytest.raises(PromptError, match="non-empty"):
        model.score("")


def test_missing_package_says_how_to_make_one(tmp_path):
    """The export is offered only where its extra is installed (not in a runtime-only install)."""
    import importlib.util

    exports = bool(importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"))
    with pytest.raises(PackageError, match="edgelm pull REPO") as raised:
        rt.load(tmp_path / "nowhere")
    assert "nowhere" in str(raised.value)
    assert ("edgelm export distilgpt2" in str(raised.value)) == exports


def test_device_cuda_without_a_cuda_provider(tiny_package):
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(DeviceError, match="onnxruntime-gpu"):
            rt.load(tiny_package, device="cuda")
    else:  # onnxruntime-gpu is installed: either CUDA really starts, or the error says so
        try:
            assert rt.load(tiny_package, device="cuda").device == "cuda"
        except DeviceError as error:
            assert "--device cpu" in str(error)


def test_unknown_device(tiny_package):
    with pytest.raises(DeviceError, match="unknown device 'tpu'"):
        rt.load(tiny_package, device="tpu")


def test_bad_thread_count(tiny_package):
    with pytest.raises(DeviceError, match="threads"):
        rt.load(tiny_package, threads=0)


def test_every_error_class_is_a_public_name():
    """Each error the library raises can be caught by its name from edgelm.runtime."""
    import inspect

    from edgelm.runtime import errors

    classes = {n for n, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, rt.EdgelmError)}
    assert {"StoreError", "QualityError", "DeadlineError"} <= classes
    assert classes <= set(rt.__all__)
    assert all(getattr(rt, name) is getattr(errors, name) for name in classes)


# --- the tokenizer and the session, built at once -------------------------------------------------------------


def _without_session_thread():
    import threading

    return not any(t.name == "edgelm-onnxruntime-session" for t in threading.enumerate())


def test_the_session_is_created_while_the_tokenizer_is_built(tiny_package, monkeypatch):
    """load() builds the tokenizer while another thread creates the session: here the tokenizer's build waits
    for the session's creation to start, which one after the other would never do (the wait would time out)."""
    import threading

    import edgelm.runtime.model.session_start as model_module

    creating, seen = threading.Event(), []
    real_session, real_tokenizer = model_module.create_session, model_module.load_tokenizer

    def create_session(*args, **kwargs):
        creating.set()
        return real_session(*args, **kwargs)

    def load_tokenizer(*args):
        seen.append(creating.wait(timeout=20))
        return real_tokenizer(*args)

    monkeypatch.setattr(model_module, "create_session", create_session)
    monkeypatch.setattr(model_module, "load_tokenizer", load_tokenizer)
    model = rt.load(tiny_package)
    assert seen == [True]
    assert model.generate("Hello", max_new_tokens=2).completion_tokens == 2
    assert _without_session_thread()


def test_the_tokenizer_is_built_once_the_session_is_initializing(tiny_package, monkeypatch):
    """The build, which holds the GIL, starts once the session's thread is inside initialize_session (or done):
    started while onnxruntime reads the graph, it would hold the session back until it ends. The thread is held
    back here before the graph is read, which a build started at once would not wait for."""
    import linecache
    import sys
    import threading
    import time

    import edgelm.runtime.model.session_start as model_module

    real_check, real_session, real_tokenizer = (
        model_module.check_installed, model_module.create_session, model_module.load_tokenizer
    )
    returned, seen = threading.Event(), []

    def held_back(*args):
        time.sleep(0.3)
        return real_check(*args)

    def create_session(*args, **kwargs):
        try:
            return real_session(*args, **kwargs)
        finally:
            returned.set()

    def where_the_session_is():
        worker = next((t for t in threading.enumerate() if t.name == "edgelm-onnxruntime-session"), None)
        frame = sys._current_frames().get(worker.ident) if worker else None
        while frame is not None:
            if "initialize_session" in linecache.getline(frame.f_code.co_filename, frame.f_lineno):
                return "initializing"
            frame = frame.f_back
        return "made" if returned.is_set() else "not yet initializing"

    def load_tokenizer(*args):
        seen.append(where_the_session_is())
        return real_tokenizer(*args)

    monkeypatch.setattr(model_module, "check_installed", held_back)
    monkeypatch.setattr(model_module, "create_session", create_session)
    monkeypatch.setattr(model_module, "load_tokenizer", load_tokenizer)
    assert rt.load(tiny_package).generate("Hello", max_new_tokens=1).completion_tokens == 1
    assert seen in (["initializing"], ["made"])


def test_the_session_thread_signals_from_inside_initialize_session(tiny_package, monkeypatch):
    """The signal that starts the tokenizer's build comes from onnxruntime's initialize_session call itself, before
    the session is made: without it the build would wait for the whole session and the start gain would be gone."""
    import edgelm.runtime.model.session_start as model_module

    events, states = [], []
    real_watch, real_session = model_module._initializing, model_module.create_session
    monkeypatch.setattr(model_module, "_initializing", lambda event: events.append(event) or real_watch(event))

    def create_session(*args, **kwargs):
        made = real_session(*args, **kwargs)
        states.append(events[0].is_set())  # the thread's own `finally` has not run yet
        return made

    monkeypatch.setattr(model_module, "create_session", create_session)
    rt.load(tiny_package)
    assert states == [True]


def test_a_refused_profile_hook_still_loads_and_leaves_no_thread(tiny_package, monkeypatch):
    import sys
    import threading

    def refused(function):
        raise RuntimeError("sys.setprofile refused")

    monkeypatch.setattr(sys, "setprofile", refused)
    assert rt.load(tiny_package).generate("Hello", max_new_tokens=1).completion_tokens == 1
    assert not [t for t in threading.enumerate() if t.name == "edgelm-onnxruntime-session"]


def test_an_unreadable_tokenizer_is_refused_before_any_session_is_made(tiny_package, tmp_path, monkeypatch):
    import edgelm.runtime.model.session_start as model_module

    made = []
    monkeypatch.setattr(model_module, "create_session", lambda *a, **k: made.append(1))
    folder = _copy(tiny_package, tmp_path / "pkg")
    with open(folder / "tokenizer.json", "r+b") as tokenizer:  # over the 64 MiB a folder's JSON file may hold
        tokenizer.truncate((64 << 20) + 1)
    with pytest.raises(PackageError, match="larger than"):
        rt.load(folder, verify=False)
    assert made == []


def test_a_tokenizer_that_is_not_utf8_is_refused_and_the_thread_has_ended(tiny_package, tmp_path, capsys):
    """tokenizer.json's bytes go to the tokenizers library, which checks the UTF-8 as it parses them."""
    folder = _copy(tiny_package, tmp_path / "pkg")
    text = (folder / "tokenizer.json").read_bytes()
    (folder / "tokenizer.json").write_bytes(text.replace(b'"<|endoftext|>"', b'"<|endoftext|\xff>"', 1))
    with pytest.raises(PackageError, match="cannot read the tokenizer .*invalid unicode"):
        rt.load(folder, verify=False)
    assert _without_session_thread()
    assert capsys.readouterr() == ("", "")


def test_the_tokenizers_freed_memory_goes_back_before_the_session_is_used(tiny_package, monkeypatch):
    """The build's freed memory is handed back while the session is still being made (the session's thread cannot
    reuse it: another malloc arena), not only once the load is done."""
    import edgelm.runtime.model.session_start as model_module
    import edgelm.runtime.model.loaded as loaded_module

    calls = []
    real_release, real_check = model_module.release_freed_memory, loaded_module.check_graph_shapes
    monkeypatch.setattr(model_module, "release_freed_memory", lambda: calls.append("release") or real_release())
    monkeypatch.setattr(loaded_module, "check_graph_shapes", lambda *a: calls.append("session used") or real_check(*a))
    rt.load(tiny_package)
    assert calls[:2] == ["release", "session used"]


def _copy(package, folder):
    import shutil

    shutil.copytree(package, folder)
    return folder


def test_a_refused_tokenizer_is_the_error_and_the_session_thread_has_ended(tiny_package, tmp_path, capsys):
    folder = _copy(tiny_package, tmp_path / "pkg")
    (folder / "tokenizer.json").write_text('{"model": "damaged"', encoding="utf-8")
    with pytest.raises(PackageError, match="cannot read the tokenizer"):
        rt.load(folder, verify=False)
    assert _without_session_thread()
    assert capsys.readouterr() == ("", "")


def test_a_graph_onnxruntime_refuses_is_the_error_and_the_thread_has_ended(tiny_package, tmp_path, capsys):
    folder = _copy(tiny_package, tmp_path / "pkg")
    (folder / "model.onnx").write_bytes(b"\x08\x07" + b"not a graph" * 40)
    with pytest.raises(PackageError, match="onnxruntime cannot load the graph"):
        rt.load(folder, verify=False)
    assert _without_session_thread()
    assert capsys.readouterr() == ("", "")


def test_when_both_fail_the_tokenizer_is_named_first(tiny_package, monkeypatch, capsys):
    """As when one was built after the other: the tokenizer's error, with the session's thread ended."""
    import edgelm.runtime.model.session_start as model_module

    def refused(*args, **kwargs):
        raise DeviceError("the session's error")

    def damaged(*args):
        raise PackageError("the tokenizer's error")

    monkeypatch.setattr(model_module, "create_session", refused)
    monkeypatch.setattr(model_module, "load_tokenizer", damaged)
    with pytest.raises(PackageError, match="the tokenizer's error"):
        rt.load(tiny_package)
    monkeypatch.setattr(model_module, "load_tokenizer", lambda *args: None)
    with pytest.raises(DeviceError, match="the session's error"):
        rt.load(tiny_package)
    assert _without_session_thread()
    assert capsys.readouterr() == ("", "")


def test_a_failed_import_of_the_models_modules_is_the_error_and_the_thread_has_ended(tiny_package, monkeypatch):
    """load() imports the Model's modules while the session's thread runs: where that import fails, the thread
    is waited for and the import's error is what the caller gets."""
    import sys

    monkeypatch.setitem(sys.modules, "edgelm.runtime.model.loaded", None)  # the import refused
    with pytest.raises(ImportError, match="edgelm.runtime.model.loaded"):
        rt.load(tiny_package)
    assert _without_session_thread()


def test_a_bad_prefix_cache_folder_ends_the_started_session_thread(tiny_package, tmp_path):
    (tmp_path / "a-file").write_text("not a folder", encoding="utf-8")
    with pytest.raises(GenerationOptionError, match="prefix_cache_dir"):
        rt.load(tiny_package, prefix_cache_mb=1, prefix_cache_dir=tmp_path / "a-file")
    assert _without_session_thread()


def test_an_altered_file_is_refused_before_onnxruntime_reads_the_graph(tiny_package, tmp_path, monkeypatch):
    """The session's thread starts once the package is open: its manifest read, every file checked against its
    sha256, the graph scanned. A package that fails those checks never reaches onnxruntime."""
    import edgelm.runtime.model.session_start as model_module

    started = []
    monkeypatch.setattr(model_module, "create_session", lambda *a, **k: started.append(1))
    folder = _copy(tiny_package, tmp_path / "pkg")
    with open(folder / "model.onnx", "r+b") as graph:
        graph.seek(-1, 2)
        last = graph.read(1)
        graph.seek(-1, 2)
        graph.write(bytes([last[0] ^ 1]))
    with pytest.raises(PackageError, match="does not match its sha256"):
        rt.load(folder)
    assert started == [] and _without_session_thread()
