. scripts/gpu_env.sh || exit 1
export OMP_NUM_THREADS=1 LLAMAFAST_TP_TIMEOUT=30
d=$OUT/d; mkdir -p $d /tmp/w
nvidia-smi -L > $d/machine.txt
t0=$SECONDS
DIAG_DUMP_S=40 PYTHONPATH=$PWD/.diag:$PYTHONPATH timeout 130 python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/tp/worker.py /tmp/w shape:llama-2-7b 33 nccl bfloat16 > $d/worker_nccl.txt 2>&1
echo "worker exit $? after $((SECONDS - t0)) s" | tee -a $d/worker_nccl.txt
t0=$SECONDS
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/tp/test_tp_run.py -k stories > $d/tests_stories.txt 2>&1
echo "stories tests exit $? after $((SECONDS - t0)) s" | tee -a $d/tests_stories.txt
tail -3 $d/tests_stories.txt
t0=$SECONDS
LLAMAFAST_TP_TIMEOUT=300 timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/profile_tp_prefill.py --shape llama-2-7b --tokens 4000 --out $d/prefill_profile_7b.json > $d/prefill_profile_7b.txt 2>&1
echo "prefill profile exit $? after $((SECONDS - t0)) s" | tee -a $d/prefill_profile_7b.txt
grep -v "^USDT\|^\[W\|^W1\|^E1" $d/prefill_profile_7b.txt | tail -80
