"""`llamafast chat`: a multi-turn session that keeps the model, its kernels and the conversation's KV cache warm.

A terminal on standard input gets a `> ` prompt with line editing and history (readline); piped input runs one
turn per line, so that scripts and tests can drive it. Replies go to stdout as they are sampled; notices, errors
and (in a terminal) a summary of each reply go to stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from llamafast.cli.streams import OutputError
from llamafast.cli.common import (
    GENERATE_KEYS, BackendOpt, ConfigOpt, DeviceOpt, DTypeOpt, FP8FormatOpt, FP8Opt, ModelOpt,
    PenaltyOpt, TemperatureOpt, TokenizerOpt, TopKOpt, TopPOpt, clean_errors, device_or_default, path_or, pick,
    preset, progress_bar, sampling_config, say_tuned, say_tuning, utf8_argument, utf8_options, context_size, note, warn,
    open_noted,
)
from llamafast.config import FP8Format
from llamafast.errors import LlamafastError

ContextOpt = Annotated[Optional[int], typer.Option(
    help="KV cache positions for the conversation; when it is full the oldest turns are dropped [default: the model's "
         "context].")]

HELP = """\
/reset          forget the conversation (the system message stays)
/system TEXT    set the system message and start over; /system alone removes it
/stats          turns, context used, speed of the last reply, kernels preloaded at start
/save FILE      write the transcript (messages, sampling, each reply's numbers) as JSON to a new FILE
/save! FILE     the same, replacing FILE if it exists (through a symbolic link: the file it points to)
/exit, /quit    leave (Ctrl-D at the prompt too)
/help           this list
//TEXT          send /TEXT as a message (a line starting with a single / is a command)"""


def chat(
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
    system: Annotated[Optional[str], typer.Option(help="System message for the conversation.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Most tokens per reply [default: 256].")] = None,
    temperature: TemperatureOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    repetition_penalty: PenaltyOpt = None,
    seed: Annotated[Optional[int], typer.Option(help="Same seed and messages, same session (default: a random seed).")] = None,
    stop: Annotated[Optional[list[str]], typer.Option(help="End a reply before this string (repeatable).")] = None,
    device: DeviceOpt = None,
    dtype: DTypeOpt = None,
    fp8: FP8Opt = False,
    fp8_format: FP8FormatOpt = FP8Format.e5m2,
    backend: BackendOpt = None,
    context: ContextOpt = None,
    config: ConfigOpt = None,
):
    """Chat with a model: one line per message, the reply streamed as it is sampled, the conversation kept in the
    KV cache so that each turn runs only its new tokens. Commands: /reset, /system TEXT, /stats, /save FILE,
    /save! FILE (replaces), /exit, /help. Ctrl-C stops a reply; Ctrl-C or Ctrl-D at the prompt leaves. Piped input: one turn per line."""
    from llamafast.chat import ChatSession
    from llamafast.generate import Engine
    from llamafast.runtime import ready

    with clean_errors():
        run = preset(config)
        run.refuse_unused("chat", GENERATE_KEYS)
        sampling = sampling_config(run, temperature, top_k, top_p, repetition_penalty, seed)
        utf8_options(system, stop)
        max_new = pick(max_new_tokens, run.max_new_tokens)
        dev = device_or_default(pick(device, run.device))
        opened = open_noted(path_or(model, run.model), path_or(tokenizer, run.tokenizer))
        size = _context_size(context, opened.config.max_seq_len, max_new)  # refused before any weights load
        with contextlib.ExitStack() as stack:
            with progress_bar() as update:
                lm, startup = stack.enter_context(ready(
                    opened, dev, pick(dtype, run.dtype), pick(backend, run.backend), fp8_format if fp8 else None, update,
                    before_tuning=say_tuning, warn=warn))
            say_tuned(startup.tuning)
            engine = Engine(lm.model, sampling, size, n_vocab=opened.tokenizer.vocab_size)
            session = ChatSession(engine, opened.tokenizer, system, max_new, stop or [], model=lm.source)
            interactive = sys.stdin.isatty()
            if interactive:
                note(f"{lm.source}: {lm.backend.value}, {lm.weights} weights, on {dev}; context {size} tokens; "
                      "/help for commands, Ctrl-D to leave")
            code = Repl(session, interactive, startup).run()
    raise typer.Exit(code)


def _context_size(context: int | None, model_context: int, max_new: int) -> int:
    size = context_size(context, model_context)
    if not 1 <= max_new < size:
        raise LlamafastError(f"--max-new-tokens must be at least 1 and leave room for a message in the context of "
                             f"{size} tokens; use --max-new-tokens {size // 2} or less, or a larger --context")
    return size


class Repl:
    """Reads lines (a prompt with readline in a terminal, plain lines from a pipe) and runs each as a command or
    a turn. run() returns the exit code: 0; from a pipe 1 if any line was refused, 130 after Ctrl-C."""

    def __init__(self, session, interactive: bool, startup=None):
        self.session, self.interactive = session, interactive
        self.startup = startup  # llamafast.runtime.Startup: the kernels preloaded, for /stats
        self.refused = 0  # lines that ended in an error (piped input exits 1 at the end if any)
        self.interrupted = False  # piped input stopped by Ctrl-C (exit code 130)
        self.commands = {"/reset": self._reset, "/system": self._system, "/stats": self._stats, "/save": self._save,
                         "/save!": self._save_over,
                         "/exit": self._exit, "/quit": self._exit, "/help": self._help}

    def run(self) -> int:
        if self.interactive:
            _enable_line_editing()
        for line in self._lines():
            try:
                if not self._handle(line):
                    break
            except KeyboardInterrupt:  # outside the reply itself (printing its summary, saving): nothing is lost
                _write("\n")
                if not self.interactive:
                    return 130
            except OutputError:
                raise  # stdout is gone: no later line can be answered either
            except LlamafastError as e:
                self._error(str(e))
        if self.interactive:
            return 0
        return 130 if self.interrupted else 1 if self.refused else 0

    def _lines(self):
        """Non-empty input lines, stripped; ends at end of input (and, in a terminal, at Ctrl-C or Ctrl-D). A line
        that is not UTF-8 is refused and the session goes on."""
        while True:
            try:
                line = self._read_line()
            except (EOFError, KeyboardInterrupt):
                if not self.interactive:
                    raise  # Ctrl-C from the shell while a pipe is read: exit code 130
                _write("\n")  # the shell's prompt on a line of its own
                return
            except LlamafastError as e:
                self._error(f"{e}; line skipped")
                continue
            if line is None:
                return
            if line.strip():
                yield line.strip()

    def _read_line(self) -> str | None:
        """One line, checked to be UTF-8: a terminal's input() either raises on bad bytes or, when the locale is
        C or UTF-8 mode is on, hands them over as lone surrogates (utf8_argument), which no tokenizer encodes."""
        try:
            line = input("> ") if self.interactive else _read_piped_line()
        except UnicodeDecodeError as e:
            raise LlamafastError(f"input is not UTF-8 text: byte 0x{e.object[e.start]:02x}") from None
        return None if line is None else utf8_argument(line, "input")

    def _handle(self, line: str) -> bool:
        """Runs one line; False ends the session. A command is a known /word alone or followed by a space; any
        other line that starts with one / is refused (a mistyped command is not sent to the model), and // sends
        the rest of the line, from its second /, as a message."""
        if line.startswith("//"):
            return self._turn(line[1:])
        if not line.startswith("/"):
            return self._turn(line)
        name, _, arg = line.partition(" ")
        command = self.commands.get(name)
        if command is None:
            self._error("unknown command, type /help; start with // to send a message beginning with /")
            return True
        return command(arg.strip()) is not False

    def _turn(self, text: str) -> bool:
        done = self.session.reply(text, on_text=_write)
        _write("\n")
        if done.dropped_turns:
            note(f"context full: dropped the oldest {done.dropped_turns} turn(s) of the conversation")
        if done.finish_reason == "interrupted":
            note("(interrupted)")
            self.interrupted = not self.interactive  # from a pipe, Ctrl-C ends the run, not just the reply
            return self.interactive
        if self.interactive:
            tps = done.tokens_per_s
            note(f"{len(done.token_ids)} tokens ({done.finish_reason}); ttft {done.ttft_s * 1e3:.1f} ms; "
                  f"decode {f'{tps:.1f} tok/s' if tps else 'n/a'}; prefilled {done.prefilled_tokens} of "
                  f"{done.prompt_tokens} prompt tokens")
        return True

    def _error(self, message: str) -> None:
        self.refused += 1
        typer.echo(f"error: {' '.join(message.split())}", err=True)

    def _reset(self, _arg: str) -> None:
        self.session.reset()
        note("conversation reset")

    def _system(self, text: str) -> None:
        self.session.set_system(text or None)
        self.session.reset()
        note("system message set; conversation reset" if text else "system message removed; conversation reset")

    def _stats(self, _arg: str) -> None:
        s = self.session.stats()
        tps, ttft = s["last_tokens_per_s"], s["last_ttft_s"]
        last = "n/a" if ttft is None else f"{f'{tps:.1f} tok/s' if tps else 'n/a'}, ttft {ttft * 1e3:.1f} ms"
        preloaded = f"; {self.startup.kernels_preloaded} kernels preloaded" if self.startup else ""
        print(f"turns {s['turns']}; context {s['context_tokens']}/{s['context_size']} tokens; last reply {last}; "
              f"{s['total_generated']} tokens generated{preloaded}", flush=True)

    def _save(self, arg: str, replace: bool = False) -> None:
        """/save writes only a new file (checked at the rename, so a file made meanwhile is kept too); /save!
        replaces one, and through a symbolic link writes the file it points to, keeping the link."""
        from llamafast.formats.files import write_atomically  # llamafast.formats imports torch: not for --help

        if not arg:
            raise LlamafastError(f"usage: {'/save!' if replace else '/save'} FILE")
        path = Path(arg).expanduser()
        target = Path(os.path.realpath(path)) if replace else path
        try:
            write_atomically(target, json.dumps(self.session.transcript(), ensure_ascii=False, indent=1) + "\n",
                             replace)
        except FileExistsError:
            raise LlamafastError(f"{path} exists; /save! {arg} replaces it") from None
        linked = f" (the file {path} links to)" if replace and path.is_symlink() else ""
        note(f"transcript saved to {target}{linked}")

    def _save_over(self, arg: str) -> None:
        self._save(arg, replace=True)

    def _exit(self, _arg: str) -> bool:
        return False

    def _help(self, _arg: str) -> None:
        print(HELP, flush=True)


def _enable_line_editing() -> None:
    """Importing readline gives input() line editing and an in-memory history (no history file is written)."""
    try:
        import readline  # noqa: F401
    except ImportError:  # Windows without pyreadline: plain input() still works
        pass


def _read_piped_line() -> str | None:
    """One line of standard input as UTF-8 without its line ending; None at the end of input."""
    raw = sys.stdin.buffer.readline() if hasattr(sys.stdin, "buffer") else sys.stdin.readline().encode()
    if not raw:
        return None
    return raw.decode("utf-8").rstrip("\r\n")


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


