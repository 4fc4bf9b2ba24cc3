"""The training command a CLI verb is given after its own options (``prudent run``, ``tune``,
``preflight``, ``replay``).

Those verbs accept options they do not know (``--lr 0.1`` belongs to the script), so a
mistyped option of prudent's own (``--budget`` for ``--budget-usd``) would otherwise be taken
for the program to start: refused here with the closest option the verb has.
"""

from __future__ import annotations

import difflib

import typer

__all__ = ["refuse_option_as_program"]


def refuse_option_as_program(context: typer.Context, command: list[str] | None) -> None:
    """Raise a usage error (exit 2) when the command's first word is an option: no program's
    name starts with a dash, so it is a mistyped option of the verb (``context``'s). Also
    when the verb's own ``--set KEY=VALUE`` comes after the command: the script would get it
    and train with its default, prudent none the wiser."""
    verb = context.command_path
    options = [opt for param in context.command.params for opt in param.opts
               if opt.startswith("--")]
    if command and "--set" in options:
        _refuse_set_after_command(verb, command)
    if not command or not command[0].startswith("-"):
        return
    word = command[0]
    # 0.75: --trails finds --trials (0.88); --stpes, the script's --steps mistyped, is not
    # sent to --set (0.67)
    close = difflib.get_close_matches(word.split("=", 1)[0], options, n=1, cutoff=0.75)
    if not close:  # a prefix: --budget for --budget-usd
        close = [opt for opt in options if opt.startswith(word.split("=", 1)[0])][:1]
    hint = f"did you mean {close[0]}? " if close else ""
    raise typer.BadParameter(f"{word!r} is not an option of {verb} ({hint}see {verb} --help); "
                             "the training command goes after --", param_hint="'COMMAND'")


def _refuse_set_after_command(verb: str, command: list[str]) -> None:
    for i, word in enumerate(command[1:], start=1):
        given = word.removeprefix("--set=") if word.startswith("--set=") else (
            command[i + 1] if word == "--set" and i + 1 < len(command) else None)
        if given is not None and "=" in given:
            raise typer.BadParameter(
                f"'--set {given}' comes after the training command, so the script would get it "
                f"and prudent would not set {given.split('=', 1)[0]!r}: put it before the "
                f"command ({verb} --set {given} -- {' '.join(command[:2])} ...)",
                param_hint="'COMMAND'")
