"""Tensor parallel end to end under torchrun: two (or four) processes, gloo on the CPU, NCCL and symmetric memory
on GPUs (marked gpu). TP=N logits against TP=1's, greedy tokens identical, sampling identical on every rank,
and bad input ending every rank with one error line and exit 1, never a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from llamafast.load import bundled_model

pytestmark = pytest.mark.slow  # every test starts torchrun or python -m llamafast
WORKER = Path(__file__).with_name("worker.py")
ON_GPU = torch.cuda.device_count() >= 2


def torchrun(n: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LLAMAFAST_TP_TIMEOUT": "30"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def run_worker(tmp_path: Path, n: int, source: str, steps: int, comm: str, dtype: str) -> list[dict]:
    done = torchrun(n, str(WORKER), str(tmp_path), source, str(steps), comm, dtype)
    assert done.returncode == 0, done.stderr[-3000:]
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(n)]


@pytest.mark.parametrize("n", [2, 4])
def test_stories_tp_equals_one_gpu(tmp_path, n):
    """stories260K in fp32 (8 query heads, 4 KV heads): TP=n logits equal TP=1's and the greedy tokens match."""
    records = run_worker(tmp_path, n, str(bundled_model()), 12, "nccl", "float32")
    for r in records:
        torch.testing.assert_close(r["tp_logits"], r["one_logits"], atol=2e-5, rtol=2e-5)
        # the nccl yardstick's emulation of the split (worker.RoundedPartials) computes the same function
        torch.testing.assert_close(r["rounded_logits"], r["ref_logits"], atol=2e-5, rtol=2e-5)
        assert r["tp_tokens"] == r["one_tokens"]
        assert r["sampled"] == records[0]["sampled"], "every rank draws the same tokens"


def _gpu_params():
    marks = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs 2 GPUs")]
    return [pytest.param(c, marks=marks, id=c) for c in ("symm", "nccl")]


@pytest.mark.parametrize("comm", _gpu_params())
def test_7b_tp2_matches_one_gpu_in_bf16(tmp_path, comm):
    """Llama-2-7B shapes, random bf16 weights, 32 decode steps on two GPUs: within the bf16 tolerance of TP=1."""
    records = run_worker(tmp_path, 2, "shape:llama-2-7b", 33, comm, "bfloat16")
    for r in records:
        assert r["comm"] == comm, r["note"]
        # bf16 through 32 layers: the tolerance is what another summation order on one GPU changes (the
        # reference backend against triton), with room for the ranks' split sums: at most twice that. nccl rounds
        # each rank's partial before the all-reduce adds them (symm adds fp32 partials and rounds once): what that
        # changes on one GPU (the reference with those roundings, worker.RoundedPartials) joins its yardstick.
        yardstick = (r["ref_logits"] - r["one_logits"]).abs()
        if comm == "nccl":
            yardstick = yardstick + (r["rounded_logits"] - r["ref_logits"]).abs()
        diff = (r["tp_logits"] - r["one_logits"]).abs()
        numbers = {"diff max": diff.max(), "yardstick max": yardstick.max(), "diff mean": diff.mean(),
                   "yardstick mean": yardstick.mean()}
        assert diff.max() <= 2 * yardstick.max() and diff.mean() <= 2 * yardstick.mean(), numbers
        assert r["sampled"] == records[0]["sampled"]


@pytest.mark.parametrize("comm", _gpu_params())
def test_stories_tp2_greedy_on_gpus(tmp_path, comm):
    """Greedy tokens at TP=2 equal TP=1's; the prompt replayed from its CUDA graph, the ranks' sums captured in
    it, gives the eager padded pass's logits bit for bit (two ranks add in either order alike) and the unpadded
    pass's within fp32 summation order."""
    records = run_worker(tmp_path, 2, str(bundled_model()), 64, comm, "float32")
    for r in records:
        assert r["comm"] == comm, r["note"]
        assert r["tp_tokens"] == r["one_tokens"]
        unpadded, padded, *replays = r["prompt_runs"]
        assert r["prompt_graphs"] == [64]
        assert all(torch.equal(replay, padded) for replay in replays)
        torch.testing.assert_close(replays[0], unpadded, atol=2e-5, rtol=2e-5)


def test_generate_tp2_streams_the_tp1_text():
    args = ["-m", "llamafast", "generate", "Once upon a time", "--temperature", "0", "--max-new-tokens", "24"]
    one = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)
    two = torchrun(2, *args)
    assert two.returncode == 0, two.stderr[-2000:]
    assert one.stdout and two.stdout == one.stdout, "rank 0 alone prints, the same text"


@pytest.mark.parametrize("comm", _gpu_params())
def test_generate_tp2_on_gpus_streams_the_tp1_text_and_exits(comm):
    """On GPUs with each --tp-comm: nccl's decode graph holds its all-reduces, and a run that destroyed the process
    group with that graph alive never exited (tp/dist.py finish)."""
    args = ["-m", "llamafast", "generate", "Once upon a time", "--temperature", "0", "--max-new-tokens", "24",
            "--dtype", "float32"]
    one = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)
    two = torchrun(2, *args, "--tp-comm", comm, timeout=120)
    assert two.returncode == 0, two.stderr[-2000:]
    assert one.stdout and two.stdout == one.stdout


@pytest.mark.parametrize("case", ["heads", "missing-on-one-rank"])
def test_bad_input_stops_every_rank(tmp_path, case):
    """--tp 3 on 8 heads, or a checkpoint that only rank 0 can see: every rank stops with exit 1, and rank 0 says
    so in one line (the other ranks agree on it in silence)."""
    t0 = time.perf_counter()
    if case == "heads":
        done = torchrun(3, "-m", "llamafast", "generate", "hi", "--max-new-tokens", "2")
        needle = "must each divide by the tensor-parallel size"
    else:
        done = torchrun(2, str(one_rank_sees(tmp_path, bundled_model().name)), "generate", "hi", "--model",
                        bundled_model().name, "--max-new-tokens", "2")
        needle = "rank 1 failed: model path not found"
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], done.stderr[-3000:]
    assert "[rank" not in done.stderr, "no rank printed a traceback (torchrun's own report of the exit follows)"
    assert time.perf_counter() - t0 < 60


@pytest.mark.parametrize("args", [["decode", "--prompt-len", "4", "--new-tokens", "4"],
                                  ["prefill", "--prompt-lens", "3,40", "--reps", "2"]], ids=["decode", "prefill"])
def test_bench_runs_tensor_parallel(args):
    """bench decode and bench prefill on two ranks: one report, rank 0's, with the whole model's rows (TP=1, on
    rank 0's device in the same call) beside the shards', and every row's ratio to them. The prompt bench's
    warm-up runs until a time has passed, and the ranks agree on when (one more run on one rank alone hung the
    others)."""
    done = torchrun(2, "-m", "llamafast", "bench", args[0], "--random-weights", "--shape", "stories260K", *args[1:],
                    "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)["results"]
    tp2, tp1 = [r for r in results if r["tp"] == 2], [r for r in results if r["tp"] == 1]
    assert tp2 and tp1 and len(tp2) + len(tp1) == len(results), results
    assert {(r["backend"], r.get("prompt_tokens")) for r in tp1} == {(r["backend"], r.get("prompt_tokens")) for r in tp2}
    assert all(r.get("tp_comm") is None for r in tp1)
    for r in results:
        assert isinstance(r["vs_tp1"], float) and r["vs_tp1"] > 0, r


def test_bench_leaves_out_tp1_where_the_whole_model_does_not_fit(tmp_path):
    """Free memory that holds a rank's shard but not the whole model (Llama-2-70B in bf16 beside its shard on an
    H200): the shards are timed, TP=1 is left out in one note, and the run succeeds."""
    script = tmp_path / "short_of_memory.py"
    script.write_text(
        "import torch\nimport llamafast.load.weights as w\nfrom llamafast.config import MODEL_CONFIGS\n"
        "whole = w.model_bytes(MODEL_CONFIGS['stories260K'], torch.float32)\n"
        "w.free_memory = lambda device: whole - 1\n"
        "from llamafast.cli import app\napp(prog_name='llamafast')\n")
    done = torchrun(2, str(script), "bench", "decode", "--random-weights", "--shape", "stories260K", "--prompt-len",
                    "4", "--new-tokens", "4", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)["results"]
    assert results and all(r["tp"] == 2 and r["vs_tp1"] is None for r in results), results
    notes = [line for line in done.stderr.splitlines() if "TP=1 not timed" in line]
    assert len(notes) == 1 and "weights need" in notes[0], done.stderr[-3000:]


def one_rank_sees(tmp_path: Path, name: str) -> Path:
    """A script that runs llamafast with its arguments in a folder of its rank's own: rank 0's holds the bundled
    model as `name`, the others' nothing, so one relative path (the same arguments) exists on rank 0 alone."""
    (tmp_path / "rank0").mkdir(exist_ok=True)
    (tmp_path / "rank0" / name).symlink_to(bundled_model())
    (tmp_path / "rank0" / "tok512.model").symlink_to(bundled_model().with_name("tok512.model"))
    (tmp_path / "rank1").mkdir()
    script = tmp_path / "in_own_folder.py"
    script.write_text(f"import os\nos.chdir(os.path.join({str(tmp_path)!r}, 'rank' + os.environ['RANK']))\n"
                      "from llamafast.cli import app\napp(prog_name='llamafast')\n")
    return script


def test_one_process_sets_up_no_distributed_run():
    """TP=1 imports none of llamafast's tensor-parallel setup and starts no process group (torch itself imports
    torch.distributed; nothing here initialises it)."""
    code = ("import sys, torch.distributed as dist\nsys.argv = ['llamafast', 'generate', 'Once', '--max-new-tokens', '2']\n"
            "from llamafast.cli import app\ntry:\n    app()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m in ('llamafast.tp.dist', 'llamafast.tp.comm')), dist.is_initialized())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[] False"
