# Sourced by the 2-GPU scripts (device-dp2.sh, device-mp2.sh), in the repository root of the GPU
# machine: the copied bundle unpacked, the environment of dlm-train under mpirun, the 350M training shape,
# and a rank SIGKILLed mid-run. Expects C (the copied build folder) and OUT set by the caller.
if [ -f "$C/bundle.tar.xz" ]; then
  mkdir -p /tmp/devcarry && tar -C /tmp/devcarry -xJf "$C/bundle.tar.xz" && C=/tmp/devcarry
fi
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$(realpath $C)/lib:$(ls -d $SP/nvidia/*/lib 2>/dev/null | tr '\n' ':')/usr/local/cuda/lib64
# NVLink multicast stays off (on a shared NVLink host it can take the host's GPUs out of service); mpirun passes
# it on with -x.
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI2=(mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE)
# Four ranks (EP2 x DP2 on one GPU: more ranks than cores is allowed).
MPI4=(mpirun -np 4 --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE)
# .gpudata: scripts/dev/make_gpudata.py writes it (random ids, megatron-core's writer).
DATA=${DLM_GPU_DATA:-.gpudata/corpus_text_document}
# The 350M shape: 24 layers, hidden 1024, 16/8 heads, FFN 2816, vocabulary 50304, QK-norm, seq 2048,
# micro-batch 8, global batch 32, bf16.
FLAGS_350M=(--data-path "$DATA" --split 100,0,0 --data-cache-path /tmp/dlm-cache --seq-length 2048
            --max-position-embeddings 2048 --qk-layernorm --bf16 --lr 2e-4 --log-interval 5 --device cuda
            --num-layers 24 --hidden-size 1024 --num-attention-heads 16 --group-query-attention --num-query-groups 8
            --ffn-hidden-size 2816 --vocab-size 50304 --mask-token 50303 --micro-batch-size 8 --global-batch-size 32
            --seed 11)

# LOG LAYOUT-FLAGS...: a 2-rank run with --distributed-timeout-minutes 0.2; once it logged iteration 10, rank 1
# is SIGKILLed; prints the job's last lines and how long after the kill it ended.
kill_rank_one_midrun() {
  local log=$1; shift
  ( timeout 300 "${MPI2[@]}" "$C/dlm-train" "${FLAGS_350M[@]}" "$@" --train-iters 100000 \
      --distributed-timeout-minutes 0.2 > "$log" 2>&1; echo "job exit $?" >> "$log" ) &
  for i in $(seq 1 120); do grep -q "iteration *10/" "$log" 2>/dev/null && break; sleep 1; done
  local victim
  victim=$(pgrep -f "dlm-train .*--distributed-timeout-minutes 0.2" | while read p; do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then echo $p; fi; done | head -1)
  local t0 t1
  t0=$(date +%s.%N); kill -9 "$victim"; wait
  t1=$(date +%s.%N)
  grep -E "rank|exit" "$log" | tail -6
  python3 -c "print(f'job ended {float('$t1') - float('$t0'):.1f} s after the kill')"
}
