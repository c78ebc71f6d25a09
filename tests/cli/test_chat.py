"""`llamafast chat` and llamafast.chat on the bundled stories260K (not a chat model, but the mechanics are the same):
multi-turn through a pipe, the KV cache reused exactly across turns, the commands, a full context, Ctrl-C in-process
and through a pseudo-terminal. Its tokenizer is SentencePiece, so turns use the Llama-2-chat format."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
import torch
from typer.testing import CliRunner

from llamafast.chat import ChatSession
from llamafast.cli import app
from llamafast.cli.chat import HELP
from llamafast.config import Backend, DType, SamplingConfig
from llamafast.generate import Engine, generate, stream_tokens
from llamafast.load import load_model

GREEDY = SamplingConfig(temperature=0)
# Each reply cut at its first newline, so that stdout holds one line per reply.
PIPED = ("chat", "--temperature", "0", "--max-new-tokens", "16", "--stop", "\n")
runner = CliRunner()


def _load():
    return load_model(None, device=torch.device("cpu"), dtype=DType.float32, backend=Backend.reference)


@pytest.fixture(scope="module")
def models():
    """Two copies: the session's, and one whose cache a fresh reference prefill may overwrite."""
    return _load(), _load()


def _fresh(lm, messages: list[dict], n: int) -> list[int]:
    """Greedy reply tokens from a new Engine prefilled with the whole conversation from position 0."""
    ids = lm.tokenizer.dialog(messages)
    return generate(Engine(lm.model, GREEDY, len(ids) + n), lm.tokenizer, ids, n).token_ids


@pytest.mark.slow
def test_multi_turn_through_a_pipe():
    lines = "Hello there\nTell me a story\nWhat happened next?\n"
    done = subprocess.run([sys.executable, "-m", "llamafast", *PIPED], input=lines, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    replies = done.stdout.split("\n")
    assert len(replies) == 4 and replies[-1] == "" and all(replies[:3]), done.stdout
    assert "Traceback" not in done.stderr and "> " not in done.stdout  # no prompt decoration from a pipe


def test_kv_reuse_is_exact(models):
    lm, ref = models
    session = ChatSession(Engine(lm.model, GREEDY, 512), lm.tokenizer, system="Be brief.", max_new_tokens=24)
    turns = ["Hello there", "Tell me a story about a cat", "What happened next?"]
    replies = [session.reply(text) for text in turns]
    log = session.transcript()["messages"]
    for k, reply in enumerate(replies):
        conversation = log[: 2 + 2 * k]  # system, then k earlier pairs, then this turn's user message
        assert conversation[-1] == {"role": "user", "content": turns[k]}
        assert reply.token_ids == _fresh(ref, conversation, 24), k
        assert reply.prefilled_tokens + reply.reused_tokens == reply.prompt_tokens
    assert replies[0].reused_tokens == 0
    assert replies[1].reused_tokens > 0 and replies[2].reused_tokens > 0
    assert replies[2].reused_tokens >= replies[1].prompt_tokens  # the whole of turn 2's prompt stayed
    prompt = lm.tokenizer.dialog(log[:-1])
    assert session.cached == (prompt + replies[2].token_ids)[: len(session.cached)]
    assert replies[2].finish_reason == "length"
    assert len(session.cached) == len(prompt) + 24 - 1  # the 24th token was sampled, never fed


def test_first_token_before_any_decode_step(models):
    """stream_tokens hands out token 0 before the first decode step (on CUDA, the graph capture); the rest of the
    tokens are unchanged, and prefill from a start position matches prefill from 0."""
    lm, _ = models
    ids = lm.tokenizer.encode("Once upon a time")
    engine = Engine(lm.model, GREEDY, 64)
    steps = []
    decode = engine.decode
    engine.decode = lambda: (steps.append(1), decode())[1]
    tokens = stream_tokens(engine, ids, 8)
    first = next(tokens)
    assert not steps
    rest = list(tokens)
    assert [first, *rest] == generate(Engine(lm.model, GREEDY, 64), lm.tokenizer, ids, 8).token_ids
    assert len(steps) == 7
    engine.prefill(ids)  # the cache holds ids; the stream below runs only the last three again
    assert list(stream_tokens(engine, ids, 8, start=len(ids) - 3)) == [first, *rest]


def test_commands_through_a_pipe(tmp_path):
    saved = tmp_path / "t.json"
    lines = ["Hello", "/stats", "/system You are a cat.", "Who are you?", f"/save {saved}", "/bogus", "/reset",
             "/stats", "Hi", "/help", "/exit", "Never answered"]
    r = runner.invoke(app, list(PIPED), input="\n".join(lines) + "\n")
    out = r.stdout.splitlines()
    stats = [line for line in out if line.startswith("turns ")]
    assert stats[0].startswith("turns 1; context ") and "/512 tokens; last reply " in stats[0]
    assert stats[1].startswith("turns 0; context 0/512 tokens; last reply n/a")
    assert any(line.startswith("/reset") for line in out)  # the help
    assert len(out) == 3 + 2 + len(HELP.splitlines())  # three replies; "Never answered" never was
    transcript = json.loads(saved.read_text())
    assert [m["role"] for m in transcript["messages"]] == ["system", "user", "assistant"]
    assert [m["content"] for m in transcript["messages"][:2]] == ["You are a cat.", "Who are you?"]
    assert transcript["sampling"]["temperature"] == 0 and len(transcript["replies"]) == 1
    assert not list(tmp_path.glob(".t.json.*"))  # no temporary file left behind
    assert f"error: {UNKNOWN}" in r.stderr and "Traceback" not in r.stderr
    assert r.exit_code == 1  # from a pipe, a refused line makes the exit code 1 once the input is done


UNKNOWN = "unknown command, type /help; start with // to send a message beginning with /"


def test_only_a_known_command_word_is_a_command(tmp_path):
    """/save followed by a tab is no /save (nor a message); // sends a message that begins with /."""
    lines = [f"/save\t{tmp_path}/x.json", "//etc is a folder", "/etc", f"/save {tmp_path}/t.json"]
    r = runner.invoke(app, list(PIPED), input="\n".join(lines) + "\n")
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {UNKNOWN}"] * 2, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]
    messages = json.loads((tmp_path / "t.json").read_text())["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == ["/etc is a folder"]
    assert r.exit_code == 1


def test_save_errors_keep_the_session(tmp_path):
    lines = ["Hello", f"/save {tmp_path}/missing/t.json", "/save", "Again"]
    r = runner.invoke(app, list(PIPED), input="\n".join(lines) + "\n")
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: cannot save to {tmp_path}/missing/t.json: No such file or directory",
                      "error: usage: /save FILE"]
    assert len(r.stdout.splitlines()) == 2 and r.exit_code == 1


def test_save_never_replaces_without_save_bang(tmp_path):
    (tmp_path / "kept.json").write_text("mine")
    (tmp_path / "target.json").write_text("linked")
    (tmp_path / "link.json").symlink_to(tmp_path / "target.json")
    lines = ["Hello", f"/save {tmp_path}/kept.json", f"/save {tmp_path}/link.json", f"/save! {tmp_path}/link.json",
             f"/save! {tmp_path}/new.json"]
    r = runner.invoke(app, list(PIPED), input="\n".join(lines) + "\n")
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {tmp_path}/kept.json exists; /save! {tmp_path}/kept.json replaces it",
                      f"error: {tmp_path}/link.json exists; /save! {tmp_path}/link.json replaces it"], r.stderr
    assert (tmp_path / "kept.json").read_text() == "mine"
    assert (tmp_path / "link.json").is_symlink() and json.loads((tmp_path / "target.json").read_text())["messages"]
    assert json.loads((tmp_path / "new.json").read_text())["messages"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json", "link.json", "new.json", "target.json"]


def test_context_full_drops_oldest_turns():
    lines = ["Hello there", "Tell me a story", "What happened next?", "And then?", "word " * 150, "Last one"]
    r = runner.invoke(app, [*PIPED, "--context", "96"], input="\n".join(lines) + "\n")
    assert "context full: dropped the oldest" in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not fit the context of 96 tokens" in errors[0], r.stderr
    assert "Traceback" not in r.stderr and len(r.stdout.splitlines()) == 5  # every other line was answered
    assert r.exit_code == 1


@pytest.mark.slow
def test_context_drops_keep_the_cache_exact(models):
    lm, ref = models
    session = ChatSession(Engine(lm.model, GREEDY, 96), lm.tokenizer, system="Hi.", max_new_tokens=16)
    for text in ["Hello there", "Tell me a story", "What happened next?", "And then?"]:
        reply = session.reply(text)
        window = session.messages[:-1]  # what this turn rendered, after any drops
        assert reply.token_ids == _fresh(ref, window, 16)  # positions past the common prefix were rewritten
        assert len(ref.tokenizer.dialog(window)) + 16 <= 96
    dropped = sum(r.dropped_turns for r in session.replies)
    assert dropped > 0 and len(session.messages) == 1 + 2 * (4 - dropped)
    assert session.messages[0] == {"role": "system", "content": "Hi."}
    assert len(session.log) == 9  # the transcript keeps the dropped turns


def test_interrupt_ends_the_reply_not_the_session(models):
    lm, ref = models
    session = ChatSession(Engine(lm.model, GREEDY, 512), lm.tokenizer, max_new_tokens=40)
    pieces = []

    def on_text(text):
        pieces.append(text)
        if len(pieces) == 5:
            raise KeyboardInterrupt

    first = session.reply("Hello there", on_text=on_text)
    assert first.finish_reason == "interrupted" and first.text == "".join(pieces) and first.text
    prompt = lm.tokenizer.dialog([{"role": "user", "content": "Hello there"}])
    assert session.cached == (prompt + first.token_ids)[: len(session.cached)]
    assert session.messages[-1] == {"role": "assistant", "content": first.text}
    second = session.reply("Again")
    assert second.finish_reason == "length" and second.reused_tokens > 0
    assert second.token_ids == _fresh(ref, session.messages[:-1], 40)
    assert session.stats()["turns"] == 2


def test_refused_before_loading():
    for args, needle in [(["--context", "600"], "--context must be between 2 and the model's context of 512"),
                         (["--context", "64", "--max-new-tokens", "64"], "--max-new-tokens must be at least 1")]:
        r = runner.invoke(app, ["chat", *args], input="")
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert r.exit_code == 1 and len(errors) == 1 and needle in errors[0], r.stderr


# Makes the pseudo-terminal on stdin the controlling terminal of the new session (subprocess's
# start_new_session), so that Ctrl-C typed into it reaches the chat as SIGINT, then becomes the chat. A forkpty()
# from pytest's process, which torch has made multi-threaded, would risk a deadlock in the child (Python 3.12 warns).
# SIGINT goes back to its default first, as a shell leaves it for a job in the foreground: pytest run in the
# background of a script inherits it ignored, and Python then never raises KeyboardInterrupt.
_ATTACH = ("import fcntl, os, signal, sys, termios; signal.signal(signal.SIGINT, signal.SIG_DFL); "
           "fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execv(sys.argv[1], sys.argv[1:])")


@pytest.mark.slow
def test_ctrl_c_in_a_terminal():
    """Through a pseudo-terminal: Ctrl-C (SIGINT from the tty) during a reply brings the prompt back; /exit leaves
    with exit code 0."""
    args = [sys.executable, "-m", "llamafast", "chat", "--max-new-tokens", "400", "--temperature", "0.8",
            "--seed", "1", "--device", "cpu"]
    env = {**os.environ, "TERM": "dumb", "COLUMNS": "200", "LINES": "50"}
    with _in_terminal(args, env) as (master, term, child):
        term.wait_for(b"> ", 60)
        os.write(master, b"Tell me a story\r")
        mark = term.wait_for(b"Tell me a story", 10)
        term.wait_until(lambda out: len(out) > mark + 60, 30)  # the reply is streaming
        os.write(master, b"\x03")
        stopped = term.wait_for(b"(interrupted)", 10)
        term.wait_for(b"> ", 10, after=stopped)
        os.write(master, b"/exit\r")
        assert _exit_code(child, term, 20) == 0, term.out.decode(errors="replace")[-2000:]
        assert b"Traceback" not in term.out
        assert b"tokens (length)" not in term.out  # the reply did not run to its end


@contextlib.contextmanager
def _in_terminal(args: list[str], env: dict):
    """The command on a pseudo-terminal of 50 x 200 as a user's shell runs it: (our end, a _Terminal reading it, the
    child), which is killed if it is still running at the end."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    child = subprocess.Popen([sys.executable, "-c", _ATTACH, *args], stdin=slave, stdout=slave, stderr=slave,
                             env=env, start_new_session=True)
    os.close(slave)
    try:
        yield master, _Terminal(master), child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(master)


# In the C locale readline passes the byte on (a UTF-8 locale's readline drops it), and input() hands it over as
# a lone surrogate, or raises where standard input's errors are strict.
@pytest.mark.slow
@pytest.mark.parametrize("errors", ["surrogateescape", "strict"])
def test_a_line_that_is_not_utf8_in_a_terminal(errors):
    """Bytes that are not UTF-8 typed at the prompt: that line is refused in one line, the chat goes on."""
    args = [sys.executable, "-m", "llamafast", "chat", "--max-new-tokens", "4", "--temperature", "0", "--device", "cpu"]
    env = {**os.environ, "TERM": "dumb", "LC_ALL": "C", "PYTHONIOENCODING": f"utf-8:{errors}"}
    with _in_terminal(args, env) as (master, term, child):
        term.wait_for(b"> ", 60)
        os.write(master, b"caf\xe9\r")
        refused = term.wait_for(b"line skipped", 10)
        os.write(master, b"Hello\r")
        term.wait_for(b"tokens (length)", 30, after=refused)  # the next line was answered
        os.write(master, b"/exit\r")
        assert _exit_code(child, term, 20) == 0, term.out.decode(errors="replace")[-2000:]
        errors = [line for line in term.out.splitlines() if line.startswith(b"error:")]
        assert len(errors) == 1 and b"0xe9" in errors[0] and b"Traceback" not in term.out, term.out[-2000:]


class _Terminal:
    """The master side of a pty: everything the child wrote, read with deadlines so a hang fails the test."""

    def __init__(self, fd: int):
        self.fd, self.out = fd, b""

    def wait_for(self, needle: bytes, timeout: float, after: int = 0) -> int:
        """Waits until needle appears at or after offset `after`; returns the offset just past it."""
        self.wait_until(lambda out: out.find(needle, after) >= 0, timeout, needle)
        return self.out.find(needle, after) + len(needle)

    def wait_until(self, ready, timeout: float, what: object = "output") -> None:
        deadline = time.monotonic() + timeout
        while not ready(self.out):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {what!r}; got {self.out[-2000:]!r}")
            if not self.drain(left):
                raise AssertionError(f"the terminal closed while waiting for {what!r}; got {self.out[-2000:]!r}")

    def drain(self, timeout: float) -> bool:
        """Reads what arrives within timeout; False once the child has closed the terminal."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return True
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            chunk = b""
        self.out += chunk
        return bool(chunk)


def _exit_code(child: subprocess.Popen, term: _Terminal, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            return child.returncode
        term.drain(0.05)  # a child blocked on a full terminal would never exit
    raise AssertionError("the chat did not exit")
