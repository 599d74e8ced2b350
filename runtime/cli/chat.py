"""`edgelm chat`: a conversation in the terminal, rendered by the package's chat template.

At a terminal it prompts, streams each answer, and keeps the history: Ctrl-C during an answer stops that answer
(what was printed stays in the history), Ctrl-C or Ctrl-D at the prompt ends the conversation. With stdin not a
terminal, each line is one user message and each answer is printed on its own line, so scripts can pipe lines in.
When the conversation no longer fits the model's context, its oldest turns are dropped (never the system message).
A line that starts with `/` is a command (runtime/cli/chat_commands.py: /help, /reset, /system, /save, /load).
"""

import os
import sys

import click

from ..errors import EdgelmError, PromptError, SessionError
from ..generation_config import sampling_implied
from ..generation_options import OPTIONS
from ..inputs import decode_utf8
from .chat_commands import is_command, run_command
from .main import generate
from .options import prefix_cache_option, verify_mode
from .terminal import echo, generated

# generate's options that mean the same in a conversation; they are declared once (runtime/generation_options.py)
SHARED_OPTIONS = (
    "package",
    *(option.name for option in OPTIONS if option.chat),
    "draft_model",
    "device",
    "threads",
    "no_verify",
    "full_verify",
)


@click.command()
@click.option("--system", help="A system message that opens the conversation (kept when old turns are dropped).")
@click.option(
    "--session",
    type=click.Path(dir_okay=False),
    help="Resume the conversation saved in FILE (its messages and key/value cache), if it exists, and save it there "
    "after each turn, so that a later `edgelm chat --session FILE` goes on without computing it again.",
)
@prefix_cache_option
def chat(system, session, prefix_cache_mb, package, device, threads, no_verify, full_verify, draft_model, **options):
    """Talk with a model: one message per line, each answer streamed. Ctrl-D (or Ctrl-C at the prompt) quits.

    Commands: /help, /reset, /system TEXT, /save FILE, /load FILE (// sends a line that starts with /).

    \b
    edgelm chat -m models/distilgpt2 --system "You are terse."
    printf 'Hello\\nWhat is ONNX?\\n' | edgelm chat --max-new-tokens 40
    edgelm chat --session notes.session    # resumes where the last run with it stopped
    """
    from ..model import load

    folder = os.path.dirname(os.path.abspath(session)) if session else None
    if folder is not None and not os.path.isdir(folder):  # before the model loads, not after the first answer
        raise click.BadParameter(f"{folder} is not a folder: the file cannot be saved there.", param_hint="--session")
    options = sampling_implied({k: v for k, v in options.items() if v is not None and v != ()})
    history = [{"role": "system", "content": system}] if system else []
    model = load(
        package,
        device=device,
        threads=threads,
        verify=verify_mode(no_verify, full_verify),
        prefix_cache_mb=prefix_cache_mb,
        draft=draft_model,
    )
    resumed = session is not None and os.path.lexists(session)
    if resumed:
        history = _resumed(model, session, system)
    # built once, with the template's stop strings, so that no turn builds them again (model.chat_prompt)
    options["stop"] = model.chat_stop(options.get("stop", model.defaults.stop))
    config = model.settings(**options)
    model.chat_template.render([*history, {"role": "user", "content": "Hi"}])  # a broken template fails now
    interactive = sys.stdin.isatty()
    if interactive:
        click.echo(
            f"Chatting with {model.package.name}. Ctrl-C stops an answer; Ctrl-D or Ctrl-C here quits; /help lists "
            "commands." + (f" Resumed {len(history)} messages from {session}." if resumed else ""),
            err=True,
        )
    said_dropped = False
    for line in _user_lines(interactive):
        if not line.strip():
            continue
        if is_command(line):
            try:
                history, said = run_command(line, history)
            except EdgelmError as error:
                said = f"Error: {error}"
            echo(said, err=True)
            _save(model, session, history)
            continue
        line = line[1:] if line.startswith("//") else line
        try:
            history, dropped = fit_history(model, [*history, {"role": "user", "content": line}], config)
        except EdgelmError as error:
            echo(f"Error: {error}", err=True)
            continue
        if dropped and not said_dropped:
            click.echo(
                f"(The oldest turns no longer fit the model's {model.arch.n_positions}-token context: they are dropped"
                f"{', the system message is kept' if system else ''}.)",
                err=True,
            )
            said_dropped = True
        answer = _answer(model, history, config)
        if answer is None:
            history.pop()  # nothing came back: the question goes too, so the turns still alternate
        else:
            history.append({"role": "assistant", "content": answer})
            _save(model, session, history)


def _resumed(model, path: str, system) -> list:
    """The messages of the conversation saved in `path`, its key/value rows restored into the model."""
    if system:
        raise PromptError(
            f"--system opens a new conversation and {path} holds one: drop --system (/system TEXT changes a resumed "
            "conversation's system message)"
        )
    saved = model.load_session(path)
    if not saved.messages:
        raise SessionError(f"{path} holds token ids, not a chat's messages; give another --session file")
    return saved.messages


def _save(model, path: str | None, history: list) -> None:
    """Save the conversation (with --session), replacing the file atomically; an empty one is not written. A save
    that fails is said, and the conversation goes on."""
    if path is None or not history:
        return
    try:
        model.save_session(path, history)
    except EdgelmError as error:
        echo(f"Error: {error}", err=True)


def fit_history(model, messages: list, config) -> tuple[list, int]:
    """The messages with their oldest turns dropped until the rendered conversation and max_new_tokens fit the
    context, and how many messages went. The system message and the last user message always stay."""
    room = model.arch.n_positions - config.max_new_tokens
    kept, first = list(messages), 1 if messages and messages[0]["role"] == "system" else 0
    while True:
        length = len(model.encode(model.chat_template.render(kept), add_special_tokens=False))
        if length <= room:
            return kept, len(messages) - len(kept)
        later_users = [i for i in range(first + 1, len(kept)) if kept[i]["role"] == "user"]
        if not later_users:
            raise PromptError(
                f"this message is {length} tokens with the conversation's template and max_new_tokens is "
                f"{config.max_new_tokens}: more than the model's {model.arch.n_positions}-token context. "
                "Send a shorter message or lower --max-new-tokens."
            )
        kept = kept[:first] + kept[later_users[0] :]  # one turn: a user message and the answers after it


def _answer(model, history: list, config) -> str | None:
    """Stream the assistant's reply to the terminal; the text shown (None if nothing was)."""
    shown, stream = [], None
    try:
        stream = model.chat_stream(history, config)
        for piece in stream:
            piece = piece if shown else piece.lstrip()  # the default template's answers begin with a space
            if piece:
                shown.append(piece)
                click.echo(generated(piece), nl=False)
                sys.stdout.flush()
    except KeyboardInterrupt:
        if stream is not None:
            stream.close()
    except EdgelmError as error:
        echo(f"{chr(10) if shown else ''}Error: {error}", err=True)
        return None
    click.echo()
    text = "".join(shown).strip()
    return text or None


def _user_lines(interactive: bool):
    """User messages: prompted lines at a terminal, else stdin's lines. Ends quietly at Ctrl-D or Ctrl-C."""
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and arrow-key history for input())
        except ImportError:
            pass
    number = 0
    while True:
        try:
            if interactive:
                line = input("> ")
            else:
                raw = sys.stdin.buffer.readline()
                if not raw:
                    return
                number += 1
                line = decode_utf8(raw, f"line {number} of stdin")
        except (EOFError, KeyboardInterrupt):
            if interactive:
                click.echo()
            return
        yield line.rstrip("\r\n")


chat.params.extend(p for p in generate.params if p.name in SHARED_OPTIONS)
