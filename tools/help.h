// The help texts of the `flashlab` command (tools/flashlab.cpp): what each command does,
// every flag of `flashlab bench` with its default, the columns and the method.
#pragma once

namespace flashlab::cli {

inline constexpr const char* kMainHelp = R"(flashlab - FlashLab's command-line tool: benchmark and check attention kernels.

usage:
  flashlab bench [flags]      time kernels on one problem, each checked first against the
                              fp64 reference (cpu_reference); prints a table
  flashlab bench --decode     the KV-cache call (forward_kvcache) at one or more cache
                              lengths, judged by GB/s of K and V read
  flashlab list               print the kernel registry: name, arch, passes, summary
  flashlab help [command]     this text, or a command's help (= flashlab <command> --help)

`flashlab bench --help` lists the benchmark's flags and explains its columns.

exit codes: 0 ok, 1 library/CUDA error or a kernel that did not run (one named with
  --kernel that refused the problem, or none of the device's kernels ran), 2 bad command
  line, 3 a kernel failed its check
)";

inline constexpr const char* kListHelp = R"(usage: flashlab list

Prints every kernel of this build's registry in registry order (for the GPU kernels, the
order of the ladder): its name (what --kernel and the API's `kernel` take), its arch
(cpu, sm80+, sm90a, ...), whether it has a forward and a backward pass, and its summary.
The last line says whether this build has CUDA kernels and sees a CUDA device.
)";

inline constexpr const char* kBenchHelp = R"(usage: flashlab bench [flags]

Runs one attention problem with each kernel of the registry that belongs to the device
(or those named by --kernel). For each kernel: one checked call (outputs poisoned with
NaN first, every element must be written, results compared with cpu_reference computed
in fp64 on the same inputs), then warm-up and timed calls. A kernel that does not
support the problem, or fails its check, gets a row with the reason and no time. Fresh
random inputs each run unless --seed.

defaults (--device auto picks the GPU when one is visible, else the CPU):
  CPU   batch 1, heads 8, seqlen 4096, head dim 128, fp32, no mask;
        kernels cpu_reference (the baseline, ~1 min) then cpu_flash
  CUDA  batch 4, heads 16, seqlen 4096, head dim 128, bf16, no mask;
        every CUDA kernel with the pass being timed (forward, or with --backward the
        backward), in registry order; the first that runs is the baseline

problem:
  --batch N          batch size
  --heads N          query heads
  --heads-kv N       key/value heads; must divide --heads (GQA/MQA) [= --heads]
  --seqlen N         query length, and key length unless --seqlen-k
  --seqlen-k N       key/value length [= --seqlen]
  --head-dim N       head dim of q and k
  --head-dim-v N     head dim of v and out [= --head-dim]
  --dtype T          fp32, fp16 or bf16 (the CPU computes all in fp32; tensor-core GPU
                     rungs take fp16/bf16 only)
  --causal           causal mask, aligned bottom-right as in FlashAttention >= 2.1
  --window L,R       sliding window: query i (diagonal key d = i + seqlen_k - seqlen)
                     sees keys d-L .. d+R; -1 = unbounded; with --causal, R is 0
  --softcap X        logits become X*tanh(logit/X); 0 = off [0]
  --quadratic-limit G  GiB of O(seqlen²) workspace that cpu_reference and naive may take
                     before they refuse the problem (the API's quadratic_workspace_limit) [4]
  --backward         time the backward pass (dq, dk, dv) instead of the forward; its out
                     and LSE come from the device's best forward kernel, run first

decode (--decode: forward_kvcache, FlashAttention's flash_attn_with_kvcache):
  --decode           time the KV-cache call: each sequence's query rows attend to a full
                     cache of L rows (cache_seqlens = L, nothing appended unless --append).
                     Problem flags keep their meaning, except: --seqlen is the query rows
                     per sequence [1], --seqlen-k or --seqlens the cache length(s) L.
                     Checked against cpu_reference's dense forward on the same keys and
                     values (the cache gathered through the block table), like a forward.
                     CPU kernels compose forward() per sequence; CUDA runs cute_fa2's
                     split-KV kernel.
                     defaults: CPU batch 2, heads 8/2, cache 4096, head dim 128, fp32;
                               CUDA batch 1, heads 32/8, caches 4096,16384,65536, head
                               dim 128, bf16
  --seqlens L,...    cache lengths, one problem each, in one table (--decode only)
  --page-size N      a paged cache of N-row pages, each sequence's pages shuffled in the
                     pool (block_table); 0 = one contiguous cache [0]
  --append N         each call also appends N new rows (k_new/v_new) at cache_seqlens =
                     L - N, so it still attends to L rows [0]
  --num-splits N     split-KV's split count (num_splits; at most the cache's key tiles);
                     0 = the count the kernel picks per call [0]
  --rotary           with --append: rotary tables too (rotary_cos/rotary_sin of 1 and 0:
                     the identity turn, so the call checks as without it, while the kernel
                     does all of rotary's work); q and the new keys are turned in the call

kernels and device:
  --kernel NAME      a kernel from `flashlab list`; repeat the flag or give a comma list
                     for several, in that order; `all` = every kernel of the device [all]
  --device D         auto, cpu or cuda [auto]; with named kernels, auto is their device
  --threads N        threads for CPU kernels and for the check [all hardware threads]
  --ladder           the GPU ladder: every CUDA kernel in registry (= ladder) order on
                     the CUDA default problem, non-causal then causal, in one table with
                     `vs prev`. A rung that also takes fp32 is timed in both dtypes and
                     shown in the faster (its shape column says which). Problem flags
                     change the problem (not --causal: the ladder runs both). Without a
                     GPU it ladders the CPU kernels on the CPU default problem.

timing and check:
  --iters N          timed calls, at most; the median is reported [CPU 5, CUDA 30]
  --warmup N         untimed calls before them, at least [CPU 1, CUDA 5]
  --warmup-ms MS     the warm-up also lasts at least this long [0]
  --budget S         seconds per kernel: a slow call means fewer calls [10]
  --rounds N         time the kernels in N alternating rounds, the order rotated each
                     round (budget / N each); a kernel's time is the median of its
                     rounds' medians [1: each kernel timed alone, one after the other]
  --seed N           seed of the random inputs [a fresh one each run; the footer says it]
  --no-check         skip the comparison with the reference (outputs are still checked
                     to be fully written)
  --check-gflops G   the fp64 reference's budget: larger problems are checked on a
                     slice (below) [80]

output:
  --json             one JSON object: device, check, timing, inputs, and "rows" with the
                     columns below as raw numbers (null where there is none)
  --csv              a header line, then one line per row (raw numbers; empty = none)
  -h, --help         this text

columns:
  kernel, shape      shape = batch x heads[/kv heads] x seqlen[/seqlen_k] x head_dim[/head_dim_v] dtype
  mask               none, causal, window(L,R), each +softcap(X) when on
  time ms            median time of one call
  runs               timed calls behind the median
  TFLOP/s            FLOPs / time. Forward FLOPs = 2*(head_dim + head_dim_v) for each
                     (query, key) pair the mask allows: 4*B*H*Sq*Sk*D with no mask, about
                     half causal, exact for windows. Backward = 2.5x its forward.
  GB/s               (--decode) bytes of K and V read / time: 2*B*L*heads_kv*head_dim*
                     element bytes (the cache rows attended to, read once)
  extra mem          the kernel's workspace_size(). FlashLab never allocates: this is the
                     scratch memory the caller provides. Inputs and outputs not counted.
  err out, err lse   max abs error vs cpu_reference in fp64 (backward: err dq, dk, dv)
  vs base            speed-up over the first row that ran and passed (base time / time)
  vs prev            (--ladder) speed-up over the previous rung that ran and passed
  check              ok, or - when not compared (--no-check); a kernel that failed (an
                     error above tolerance, an output element not written) shows FAIL
                     and the reason instead of a time

tolerance (max abs error; unit-normal inputs, default softmax scale):
  fp32 1e-4 (out, lse), 2e-4 (dq, dk, dv); fp16 5e-3, 1e-2; bf16 2e-2, 4e-2.
  A gradient's tolerance is multiplied by max(1, max |reference gradient|): its
  rounding error grows with its size (GQA sums over heads, causal first keys).

check on a slice: a problem whose fp64 reference would cost more than --check-gflops is
  checked on batch entry 0, as many query heads as threads (backward: whole kv-head
  groups, as many as fit) and, if still too large, on the last query rows (which see
  exactly the keys they see in the full problem; the backward's dk and dv are then
  compared on the keys no earlier row sees); the footer says which.

timing: CPU std::chrono::steady_clock; CUDA a cudaEvent pair per call on one stream,
  rotating among input sets whose total exceeds 2x the L2 cache (capped at 4 GiB and
  1/4 of free memory). After the checked call: warm-up, then the median of the timed
  calls. Slow kernels get fewer calls (the runs column says how many): as many as fit
  the budget, at least 3 (or --iters if fewer), warm-up at most a quarter of it. A
  checked call longer than budget/8 may carry one-time work, so one more call is timed
  to plan the rest; a call over 10 s is its own one sample. Calls over 3 s show a
  progress line on stderr. docs/BENCHMARK.md describes the method.

exit codes: 0 ok, 1 library/CUDA error or a kernel that did not run (one named with
  --kernel that refused the problem, or none of the device's kernels ran), 2 bad command
  line, 3 a kernel failed its check
)";

}  // namespace flashlab::cli
