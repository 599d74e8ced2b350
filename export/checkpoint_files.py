"""The files a package takes from its checkpoint beside the graph, read and checked before any work: the
tokenizer (tokenizer.json, or GPT-2's vocab.json and merges.txt), tokenizer_config.json with the chat template,
and the generation defaults. Never a checkpoint's Python code: no AutoTokenizer, no auto_map."""

import json
from pathlib import Path

from edgelm.runtime.errors import GenerationOptionError
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.package.format import GENERATION_CONFIG

from .errors import ExportError


def read_tokenizer(text: str):
    """tokenizer.json's text as a `tokenizers` Tokenizer, or ExportError saying to save it again."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(text)
    except Exception as error:  # tokenizers raises a bare Exception for a damaged file
        raise ExportError(
            f"the checkpoint's tokenizer cannot be read: {str(error)[:200]}. Save it again with the model (tokenizer.save_pretrained)."
        ) from None


def check_chat_template(source) -> None:
    """ExportError with the template's fault when Jinja source cannot be compiled as the runtime compiles it."""
    from edgelm.runtime.errors import ChatError
    from edgelm.runtime.text.chat_template import compile_template

    try:
        compile_template(source, "the chat template given")
    except ChatError as error:
        raise ExportError(str(error)) from None


def tokenizer_config(folder: Path, chat_template: str | None) -> dict | None:
    """The checkpoint's tokenizer_config.json as the package ships it: without `auto_map` (the package ships no
    Python code for it to name) and with `chat_template` set (the one given, else the checkpoint's
    chat_template.jinja, where transformers saves a template beside it). None when it can be copied as it is."""
    jinja = folder / "chat_template.jinja"
    if chat_template is None and jinja.is_file():
        try:
            chat_template = jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ExportError(f"cannot read {jinja}: {error}") from None
        check_chat_template(chat_template)
    path = folder / "tokenizer_config.json"
    config = None
    if path.exists():
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            if chat_template is None:
                return None  # not JSON: copied as it is; the package's tokenizer is tokenizer.json
            raise ExportError(f"cannot read {path} to set its chat template: {error}") from None
        if not isinstance(config, dict):
            if chat_template is None:
                return None
            raise ExportError(f"{path} does not hold a JSON object; fix or remove it.")
    if chat_template is None and (config is None or "auto_map" not in config):
        return None
    config = {k: v for k, v in (config or {}).items() if k != "auto_map"}
    return config | ({"chat_template": chat_template} if chat_template is not None else {})


def tokenizer_json(folder: Path) -> str:
    """The checkpoint's tokenizer as tokenizer.json text, from tokenizer.json or vocab.json with merges.txt."""
    if (folder / "tokenizer.json").exists():
        return (folder / "tokenizer.json").read_text(encoding="utf-8")
    if (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
        # GPT-2's own tokenizer class, never AutoTokenizer: an auto_map or a custom tokenizer_class in
        # tokenizer_config.json would make transformers offer to import Python files from the checkpoint.
        from transformers import GPT2TokenizerFast

        try:
            tokenizer = GPT2TokenizerFast.from_pretrained(str(folder), trust_remote_code=False)
        except Exception as error:  # transformers raises many types for damaged vocab or merges files
            raise ExportError(
                f"the checkpoint's vocab.json / merges.txt cannot be read ({type(error).__name__}: {str(error)[:200]}); "
                "save the tokenizer again with the model (tokenizer.save_pretrained)."
            ) from None
        return tokenizer.backend_tokenizer.to_str()
    raise ExportError(f"{folder} has no tokenizer: expected tokenizer.json, or vocab.json with merges.txt.")


def generation_defaults(checkpoint) -> dict | None:
    """The generation_config.json to write when the checkpoint has none (its bos id and every end-of-text id
    config.json names: Llama 3's are a list), else None (its own is copied). Either is checked as the runtime
    will read it (every end-of-text id in the vocabulary, each setting in range): ExportError before anything is
    written."""
    path, arch = checkpoint.folder / GENERATION_CONFIG, checkpoint.arch
    if path.exists():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
            raise ExportError(f"{path} is not readable JSON ({str(error)[:120]}); fix or remove it.") from None
        if not isinstance(data, dict):
            raise ExportError(
                f"{path} holds a JSON {type(data).__name__}, not an object of settings; fix or remove it."
            )
        written, where = None, path
    else:
        eos = checkpoint.config.get("eos_token_id", arch.eos_token_id)
        data = written = {"bos_token_id": arch.bos_token_id, "eos_token_id": eos}
        where = checkpoint.folder / "config.json"
    try:
        GenerationConfig.from_generation_config_json(data, arch.eos_token_id, arch.pad_token_id, arch.vocab_size)
    except (GenerationOptionError, TypeError, ValueError) as error:
        raise ExportError(
            f"{where} holds a generation setting edgelm cannot use: {str(error)[:200]}. Fix it."
        ) from None
    return written
