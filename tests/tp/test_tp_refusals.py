"""torchrun's side of bad input and of standard input and output: the prompt rank 0 alone reads, the reader that
leaves early, ranks started with different arguments, commands that do not run tensor parallel. Two CPU ranks
(gloo) on stories260K; the refusals that need no second rank are cases in tests/cli/bad_inputs.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta

import pytest
from typer.testing import CliRunner

from llamafast.cli import app
from llamafast.load import bundled_model

from ..cli.bad_input_files import RANK0_OF_2
from .test_tp_run import one_rank_sees, torchrun

GREEDY = ["--temperature", "0", "--max-new-tokens", "8"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "LLAMAFAST_TP_TIMEOUT": "30"}  # as test_tp_run.torchrun's


def errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


def one_process(prompt: str) -> str:
    done = subprocess.run([sys.executable, "-m", "llamafast", "generate", prompt, *GREEDY], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_prompt_from_standard_input_is_rank_0s(tmp_path):
    """Rank 0 reads standard input and every rank runs its prompt: the text of one process from that prompt."""
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "llamafast",
         "generate", "-", *GREEDY], input="Once upon a time\n", capture_output=True, text=True, timeout=240,
        env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == one_process("Once upon a time")
    assert "using gloo all-reduces" in done.stderr and "nccl" not in done.stderr, done.stderr[-2000:]


@pytest.mark.slow
def test_prompt_file_only_rank_0_can_read(tmp_path):
    (tmp_path / "rank0").mkdir()
    (tmp_path / "rank0" / "prompt.txt").write_text("Once upon a time\n")
    script = one_rank_sees(tmp_path, "unused.bin")
    done = torchrun(2, str(script), "generate", "--prompt-file", "prompt.txt", *GREEDY)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == one_process("Once upon a time")


@pytest.mark.slow
def test_reader_that_leaves_early_ends_every_rank_with_0():
    """`torchrun ... generate ... | head -c 5`: rank 0 writes on into nothing and takes part to the end."""
    cmd = (f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node=2 -m llamafast generate "
           "'Once upon a time' --max-new-tokens 64 | head -c 5")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=240,
                          env=ENV)
    assert done.returncode == 0 and len(done.stdout) == 5, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and not errors(done), done.stderr[-3000:]


@pytest.mark.slow
def test_ranks_started_with_different_arguments(tmp_path):
    script = tmp_path / "own_token_count.py"
    script.write_text("import os, sys\nfrom llamafast.cli import app\n"
                      "sys.argv = ['llamafast', 'generate', 'hi', '--max-new-tokens', str(2 + int(os.environ['RANK']))]\n"
                      "app()\n")
    done = torchrun(2, str(script))
    assert done.returncode != 0
    assert len(errors(done)) == 1 and "started with different arguments" in errors(done)[0], done.stderr[-3000:]


@pytest.mark.slow
def test_convert_under_torchrun_is_refused_on_every_rank(tmp_path):
    out = tmp_path / "out"
    done = torchrun(2, "-m", "llamafast", "convert-fp8", str(bundled_model()), str(out))
    assert done.returncode != 0 and not out.exists()
    assert len(errors(done)) == 1 and "convert-fp8 does not run under torchrun" in errors(done)[0], done.stderr
    codes = re.findall(r"exitcode\s+: (-?\d+)", done.stderr)  # torchrun's report, a paragraph per rank
    # Rank 1 exits 1 too, unless torchrun stopped it (SIGTERM, -15) when rank 0 left before rank 1 got that far:
    # still starting on a busy machine, it cannot know. No rank ever converts or exits 0.
    assert "1" in codes and len(codes) == 2 and set(codes) <= {"1", "-15"}, done.stderr


def test_other_ranks_are_silent_about_what_rank_0_reports(monkeypatch):
    """Rank 1 of a refused command: exit 1 and no line of its own (it waits for torchrun to stop it)."""
    monkeypatch.setattr("llamafast.cli.tp._SILENT_WAIT_S", 0)
    r = CliRunner().invoke(app, ["info"], env={**RANK0_OF_2, "RANK": "1", "LOCAL_RANK": "1"})
    assert r.exit_code == 1 and r.stderr == "" and r.stdout == "", r.stderr


@pytest.mark.parametrize(("value", "seconds"), [("1.5", 1.5), ("30", 30), (None, 60)])
def test_tp_timeout_in_seconds(monkeypatch, value, seconds):
    from llamafast.tp.dist import timeout

    if value is None:
        monkeypatch.delenv("LLAMAFAST_TP_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("LLAMAFAST_TP_TIMEOUT", value)
    assert timeout() == timedelta(seconds=seconds)


@pytest.mark.slow
def test_bench_refusals_are_printed_once():
    """bench's own checks run on every rank alike: rank 0 reports, once."""
    done = torchrun(2, "-m", "llamafast", "bench", "--random-weights", "--shape", "stories260K", "--prompt-len", "0")
    assert done.returncode != 0
    assert len(errors(done)) == 1 and "--prompt-len must be at least 1" in errors(done)[0], done.stderr[-3000:]


BENCH = ["bench", "--random-weights", "--shape", "stories260K"]
SYMM_ONLY = "--backend persistent under --tp waits on symmetric memory"


@pytest.mark.slow
@pytest.mark.parametrize("command,args,message", [
    (["generate", "hi", *GREEDY], ["--backend", "persistent", "--tp-comm", "nccl"], SYMM_ONLY),
    (BENCH, ["--backend", "persistent", "--tp-comm", "nccl"], SYMM_ONLY),
    (["generate", "hi", *GREEDY], ["--backend", "compile"],
     "--tp runs the triton, persistent and reference backends, not compile"),
], ids=["generate-persistent-nccl", "bench-persistent-nccl", "generate-compile"])
def test_backends_tensor_parallel_cannot_run_are_refused_once(command, args, message):
    """Before any weights load: the persistent step synchronises through symmetric memory only, compile not at all."""
    done = torchrun(2, "-m", "llamafast", *command, *args)
    assert done.returncode == 1
    assert len(errors(done)) == 1 and message in errors(done)[0], done.stderr[-3000:]
