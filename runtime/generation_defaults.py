"""A package's generation defaults, checked as the options a caller gives at run time are.

Two files of a package set defaults: generation_config.json (every call's) and config.json's
task_specific_params["text-generation"] (the pipeline's). Both go through the one typed check of run-time options
(GenerationConfig, and max_length_option for the pipeline's max_length), so a value of any other form (a number
written as a string, a float such as 1e12, a bool, a list or an object) is refused, never skipped or read
another way; then through what only a default can get wrong: leaving no room for a prompt in the context, which
would make every call fail. A refusal is one PackageError naming the file and the setting.
"""

from numbers import Integral

from .errors import GenerationOptionError, PackageError
from .generation_config import GenerationConfig

LENGTHS = ("max_new_tokens", "max_length")  # the settings that can leave no room for a prompt


def max_length_option(value):
    """max_length (new tokens and the prompt together, as in transformers) checked: None or an integer >= 1."""
    if value is not None and (not isinstance(value, Integral) or isinstance(value, bool) or value < 1):
        raise GenerationOptionError(f"max_length must be an integer >= 1, got {value!r:.60}", param="max_length")
    return value


def generation_defaults(data: dict, arch, where) -> GenerationConfig:
    """generation_config.json's settings (transformers' format; keys edgelm does not use are ignored) over
    GenerationConfig's, with the package's end-of-text and padding ids and vocabulary; PackageError naming
    `where` for a setting a caller could not give, or one that leaves no room for a prompt."""
    try:
        if not isinstance(data, dict):
            raise GenerationOptionError("it does not hold a JSON object of settings", param="")
        max_length_option(data.get("max_length"))  # any other form was read as "not given" before
        config = GenerationConfig.from_generation_config_json(
            data, arch.eos_token_id, arch.pad_token_id, arch.vocab_size
        )
        if any(data.get(name) is not None for name in LENGTHS):
            _room(config.max_new_tokens, arch.n_positions)
        return config
    except (GenerationOptionError, TypeError, ValueError, AttributeError) as error:
        raise _refused(where, error) from None


def task_defaults(options: dict, base: GenerationConfig, arch, where) -> dict:
    """The pipeline's defaults (task_specific_params' settings and max_length) checked over `base`, the package's
    other defaults; returns them as given. PackageError naming `where` as generation_defaults does."""
    try:
        settings = {k: v for k, v in options.items() if k != "max_length"}
        config = base.with_options(**settings)
        if settings.get("max_new_tokens") is not None:
            _room(config.max_new_tokens, arch.n_positions)
        max_length = max_length_option(options.get("max_length"))
        if max_length is not None and max_length > arch.n_positions:  # it counts the prompt: the context is room
            raise GenerationOptionError(
                f"max_length {max_length} is over the model's {arch.n_positions}-token context", param="max_length"
            )
        return options
    except (GenerationOptionError, TypeError, ValueError, AttributeError) as error:
        raise _refused(where, error) from None


def _room(max_new_tokens: int, n_positions: int) -> None:
    if max_new_tokens >= n_positions:
        raise GenerationOptionError(
            f"max_new_tokens {max_new_tokens} leaves no room for a prompt in the {n_positions}-token context",
            param="max_new_tokens",
        )


def _refused(where, error: Exception) -> PackageError:
    return PackageError(
        f"{where} holds a setting edgelm cannot use ({str(error)[:200]}); fix or remove it, or export the package "
        "again."
    )
