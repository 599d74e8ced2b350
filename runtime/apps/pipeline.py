"""`pipeline("text-generation")`: the call from transformers' tutorials, with the checkpoint's settings for the task.

    generator = edgelm.runtime.pipeline("text-generation", model="models/distilgpt2")
    generator("Hello, I'm a language model,", max_length=30, num_return_sequences=5)

As transformers' Pipeline does, it applies the checkpoint's task_specific_params["text-generation"] (the package's
config.json, read only where the manifest lists it; distilgpt2's is {"do_sample": true, "max_length": 50}) over
the package's generation defaults, and the call's options over those. max_length counts the prompt, as in
transformers: a prompt of n tokens gets max_length - n new tokens, and max_new_tokens, where the call gives it,
wins over max_length.

Two differences from transformers 4.57, on purpose: its TextGenerationPipeline also lays defaults of its own
(max_new_tokens=256, temperature=0.7) under the checkpoint's, and that max_new_tokens then outranks every
max_length, the tutorial's own max_length=30 included (it warns and generates 256 tokens); here max_length is
honoured. Keys of task_specific_params that are no generation option (a "prefix", say) are ignored.
"""

from ..errors import GenerationOptionError, PackageError, PromptError
from ..generation_config import CONSTRAINTS, GenerationConfig
from ..generation_defaults import max_length_option, task_defaults
from ..model import Model, load
from ..package.files import read_json
from ..package.format import HF_CONFIG
from ..package.open import Package

TASK = "text-generation"


def pipeline(task: str = TASK, model=None, device: str = "auto", **load_options):
    """A callable `generator(prompt or prompts, return_full_text=True, **options)` returning, per prompt, a list
    of {"generated_text": ...} (one per num_return_sequences), as transformers' pipeline does."""
    if task != TASK:
        raise GenerationOptionError(f"edgelm's pipeline does only {TASK!r}, not {task!r}")
    loaded = model if isinstance(model, Model) else load(model, device=device, **load_options)
    where = f"{loaded.package.folder / HF_CONFIG}: task_specific_params[{TASK!r}]"
    task_options = task_defaults(task_params(loaded.package), loaded.defaults, loaded.arch, where)

    def run(prompt, return_full_text: bool = True, **options):
        prompts = [prompt] if isinstance(prompt, str) else list(prompt) if isinstance(prompt, (list, tuple)) else None
        if prompts is None or not all(isinstance(p, str) for p in prompts):
            raise PromptError(f"the pipeline takes a text prompt or a list of them, got {prompt!r:.60}")
        merged = {**task_options, **options}
        max_length = None if "max_new_tokens" in options else max_length_option(merged.get("max_length"))
        merged.pop("max_length", None)
        config = loaded.settings(**merged)
        results = []
        for text in prompts:
            completions = loaded.generate([text], _with_max_length(loaded, text, config, max_length))
            results.append([{"generated_text": (text if return_full_text else "") + c.text} for c in completions])
        return results[0] if isinstance(prompt, str) else results

    return run


def task_params(package: Package) -> dict:
    """The checkpoint's task_specific_params["text-generation"] from the package's config.json: the generation
    options and max_length ({} where the package has no config.json or the config has none for the task)."""
    if package.manifest is not None and HF_CONFIG not in package.manifest.files:
        return {}
    try:
        path = package.path(HF_CONFIG)
    except PackageError:
        if package.manifest is None:
            raise
        raise PackageError(
            f"{package.folder / HF_CONFIG} is missing; the package is damaged. Export it again."
        ) from None
    params = read_json(path, package.read_limit(path)).get("task_specific_params") or {}
    if not isinstance(params, dict) or not isinstance(params.get(TASK, {}), dict):
        raise PackageError(
            f"{path}: task_specific_params must map task names to objects of settings; fix it or export the package again."
        )
    known = set(GenerationConfig.__dataclass_fields__) - {
        "vocab_size",
        "greedy_copies",
        *CONSTRAINTS,
    }  # not a package's
    return {k: v for k, v in params.get(TASK, {}).items() if k in known or k == "max_length"}


def _with_max_length(model: Model, text: str, config: GenerationConfig, max_length: int | None) -> GenerationConfig:
    """The config for one prompt: with max_length, max_new_tokens is what is left of it after the prompt."""
    if max_length is None:
        return config
    length = len(model.encode(text)) or 1  # an empty prompt starts from the start token
    if length >= max_length:
        raise GenerationOptionError(  # transformers' message, then what to do
            f"Input length of input_ids is {length}, but `max_length` is set to {max_length}: no room for new "
            "tokens. Raise max_length (it counts the prompt) or, better, set max_new_tokens.",
            param="max_length",
        )
    return config.with_options(max_new_tokens=max_length - length)
