"""Every threshold the analysis uses, in one place, each with its reason or source.

(Longer than 450 lines because it is the one table of them, by design: a threshold and its reason
are read together, and split files would hide one from another.)

Sources (peers' rules, what users hit, what was measured here) are in ``docs/sources.md``.
Shares are fractions of the measured wall time; percentages are named ``*_PCT``.
"""
from gpufeed import defaults


# -- Is the job input-bound? ---------------------------------------------------------------------
# PyTorch Profiler's TensorBoard plugin recommends more workers when DataLoader time is > 5% of the
# step; TensorFlow's input-pipeline analysis calls 5-20% "moderately" input-bound.
DATA_WAIT_SHARE_FLAG = 0.05
# TensorFlow's input-pipeline analysis: > 20% is "highly input-bound".
DATA_WAIT_SHARE_HIGH = 0.20

# The verdict: the largest loss (the input pipeline, copies, host-side GPU idle) once it reaches this
# bar, and "compute" only when none does, as TensorFlow's analyzer calls a run input-bound from 5% of
# its time whatever compute takes (a run whose input costs 45% is input-bound, not "55% compute"). A
# loss below the bar is not worth a finding of its own; one at or above it is always explained by one.
BOTTLENECK_MIN_SHARE = DATA_WAIT_SHARE_FLAG

# -- Where the loader's time goes -------------------------------------------------------------------
# A worker that spends less than half of its fetch time on the CPU is mostly asleep (reading,
# waiting on storage or the network). SageMaker's IOBottleneck uses the same 50% bar on I/O wait.
WORKER_ASLEEP_CPU_RATIO = 0.5
# The host counts as saturated when its cores are this busy on average: SageMaker's CPUBottleneck
# rule counts a core > 90% busy as a bottleneck.
CPU_SATURATED_PCT = 90.0
# ...and already when the CPU-bound workers are as many as the cores and the cores are this busy: the
# training process takes turns with them, so the sampler's 100 ms per-core readings of one saturated
# loop (2 CPU-bound workers on 2 cores) ranged 86-97% busy over ten runs measured here.
CPU_SATURATED_FULL_WORKERS_PCT = 75.0
# Workers contend when the CPU-bound ones are runnable but not running: they are on the CPU for
# less than this share of their fetch time although the host is saturated.
WORKER_CONTENDED_CPU_RATIO = 0.8
# Off-CPU workers are queuing for a core, not sleeping on I/O, when the sampler finds them in
# state R (runnable) at least this often; half is the natural split between the two.
WORKER_RUNNABLE_SHARE = 0.5
# Programs outside the command are named in a finding once they take this many cores on average
# (a quarter core is well above the sampler's own noise on an idle machine).
OTHER_PROGRAMS_CORES = 0.25
# ...and each program named in it took at least this many cores on average over the window.
OTHER_PROGRAM_MIN_CORES = 0.1

# -- Threads inside workers ------------------------------------------------------------------------
# A worker using more than this many cores while it fetches runs several compute threads
# (torch intra-op, OpenCV, BLAS): one thread would be at most 1.0. Margin for the loader's own
# helper threads.
WORKER_MULTITHREAD_CPU_RATIO = 1.3

# -- Worker start-up --------------------------------------------------------------------------------
# Start-up paid each epoch is worth fixing once it costs as much as a flagged data wait (diagnose's
# worker_restart / loader_rebuilt findings). tune and autotune try persistent workers once it costs
# more than their own measured noise instead (at least TUNE_NOISE_FLOOR): they measure the fix.
WORKER_STARTUP_SHARE_FLAG = 0.05

# -- Host-to-device copies ----------------------------------------------------------------------------
# Pageable copies block the host; below 5% of the wall time pinning cannot buy much.
PAGEABLE_COPY_SHARE_FLAG = 0.05
# Pinned copies on the stream the steps run on stall the kernels queued after them (CUDA runs a
# stream's work in order: CUDA C++ Programming Guide, "Streams"); flagged from the same 5% of the wall
# time, below which a side-stream prefetcher cannot buy much either.
COPY_STALL_SHARE_FLAG = 0.05
# "pin_memory=True alone would not help" where at least half the pageable bytes are copied by
# copy_/torch.as_tensor/torch.tensor(device=) (a DataLoader's pin_memory never pins them) or without
# non_blocking=True (a pinned copy without it still holds the host): the larger part decides.
PIN_ALONE_MAJORITY = 0.5

# -- GPU utilization (NVML) -----------------------------------------------------------------------------
# SageMaker's LowGPUUtilization rule: p95 > 70% while p5 < 10% is the fluctuating pattern (the
# nvidia-smi sawtooth).
GPU_UTIL_FLUCTUATING_P95_PCT = 70.0
GPU_UTIL_FLUCTUATING_P5_PCT = 10.0
# PyTorch Profiler's TensorBoard plugin flags GPU utilization below 50%.
GPU_UTIL_LOW_PCT = 50.0
# NVML's utilisation is the share of time *any* kernel runs; GPM's SM activity the share of SMs busy
# (NVIDIA DCGM's profiling metrics: DCGM_FI_PROF_SM_ACTIVE against DCGM_FI_DEV_GPU_UTIL; docs/sources.md).
# Busy at least 90% of the time with under a third of the SMs working: the kernels are too small to fill
# the GPU, or the host launches them one by one (launch-bound), a host-side cause, not a fed GPU.
GPU_BUSY_UTIL_PCT = 90.0
SM_ACTIVE_LOW_PCT = 33.0

# -- Measurement ------------------------------------------------------------------------------------------
# Steps measured before the window opens: the default's reason is in ``defaults.py``.
DEFAULT_WARMUP_STEPS = defaults.WARMUP_STEPS
# Measured throughput above the loader's CPU-time bound by more than this is flagged as suspect
# (docs/sources.md, "A measurement trap").
CPU_BOUND_TOLERANCE = 1.10
# The workers' own count of what they made is used only where their rows reach this close to the
# window's end: they flush at least every second (docs/run-record.md), and a worker killed at exit
# loses what it had not flushed.
WORKER_ROWS_REACH_S = 1.5
# Two training loaders are stepped together (zip(a, b), Lightning's CombinedLoader: one loop step
# takes a batch of each) when this share of the second's requests falls between a delivery of the
# first and its next request, one per step: the loop's step is then the pair, its samples both
# loaders'. A GAN's second loader asked once every two batches of the first is not: its steps are
# half as many, outside the ratio below (analysis/together.py).
TOGETHER_MIN_SHARE = 0.9
TOGETHER_STEP_RATIO = (0.8, 1.25)
# ...and the lead's steps holding them are at least half as many as the second's batches: a loop
# over one loader and then the other puts all of the second's requests after the first's last
# batch; accelerate's look-ahead puts two in one step at each epoch's start (3-batch epochs: 2 in 3).
TOGETHER_MIN_STEPS_HELD = 0.5
# Suggested prefetch_factor for latency-bound loaders: deeper queues absorb read-latency spread
# (loadtune and tf.data both raise prefetching for latency-bound inputs).
LATENCY_PREFETCH_FACTOR = 4

# -- Severity ---------------------------------------------------------------------------------------------------
SEVERITY_HIGH_SHARE = DATA_WAIT_SHARE_HIGH
SEVERITY_MEDIUM_SHARE = DATA_WAIT_SHARE_FLAG

# -- Several ranks (torchrun, DistributedDataParallel) --------------------------------------------
# A straggler's loader makes it wait for data markedly more than the others: at least the flagged
# data-wait share (the 5% bar above) and at least this many times the other ranks' median share.
# Two is the smallest ratio that separates "one rank waits" from run-to-run noise between ranks
# fed the same way (measured here: 2 gloo ranks fed alike on one busy 2-core host: 1.03-1.06x).
STRAGGLER_WAIT_RATIO = 2.0
# The others wait for it in the collective: at least this share of the straggler's extra data
# wait per step reappears as extra step compute on the other ranks (the gradient all-reduce blocks
# their backward until the straggler arrives). Half: the rest may overlap with their own compute.
STRAGGLER_SYNC_ABSORBED = 0.5
# Load imbalance: SageMaker Debugger's LoadBalancing rule flags a Jensen-Shannon distance > 0.5
# between per-GPU utilization histograms. The same distance and bar compare each rank's step-time
# histogram with the other ranks' pooled one.
IMBALANCE_JS_DISTANCE = 0.5
# Histogram bins: GPU utilization in 10-point bins (0-100%); step times in bins 10% wide on a log
# scale, so that ranks whose step times differ by less than 10% share their bins (no imbalance).
IMBALANCE_GPU_UTIL_BIN_PCT = 10.0
IMBALANCE_STEP_TIME_BIN_RATIO = 1.10
# The distance alone is noisy with few values (measured here: two balanced gloo ranks, 30 steps of
# ~3 ms on a busy 2-core host, reached 0.54): a rank also needs this many values, and the ranks'
# typical values (GPU util p50; mean step time, which ranks synchronized every step share) must
# differ by at least one bin.
IMBALANCE_MIN_VALUES = 20

# -- Merging the records of several nodes (``gpufeed analyze DIR1 DIR2 ...``) -----------------------
# Each node's times are put on node 0's clock by the nodes' wall clocks (meta.clock_offset_s). The
# ranks' synchronized steps then measure what remains: NTP keeps hosts within a few milliseconds
# of each other on a LAN, so a residual larger than this means a wall clock is wrong, and the
# steps are used to align that node instead.
CLOCK_RESIDUAL_CORRECT_S = 0.010
# Steps count as synchronized across two ranks (a collective each step) when their request times
# differ by a spread (interquartile range) under this share of the median step time.
CLOCK_SYNC_SPREAD_SHARE = 0.25
# Runs further apart than this by their wall clocks are not one job whose clock is wrong: two
# separate jobs can look alike step by step, and must not be "aligned" onto each other. Five
# minutes is far beyond the drift of any host that keeps time at all (NTP's panic threshold, past
# which it stops correcting, is 1000 s; its usual step threshold is 128 ms).
CLOCK_MAX_ERROR_S = 300.0

# -- gpufeed tune -------------------------------------------------------------------------------------------------
# Two throughputs closer than this (relative) are a tie, whatever the measured spread: loadtune
# picks the fewest workers within 2% of the best, and Cachew accepts a 3% loss when scaling down.
TUNE_NOISE_FLOOR = 0.03
# Measured run-to-run spread is used as the noise up to this cap: beyond it the machine is too busy
# for any decision, and the result says so.
TUNE_NOISE_CAP = 0.25
# A trial measures this long after its warm-up (long enough for several refills of a deep queue
# and, with short epochs, several worker start-ups), unless told otherwise.
TUNE_TRIAL_SECONDS = 4.0
# The largest num_workers tried, per core: latency-bound loaders scale far past the core count
# (docs/sources.md: 2 cores, 4 ms per sample, 8 workers gave 4.7x the throughput of 2).
TUNE_MAX_WORKERS_PER_CORE = 16
# Workers tried on the way up; the refinement adds the points between (3, 6, 12, ...).
TUNE_WORKER_LADDER = (0, 1, 2, 4, 8, 16, 32, 64, 128)
TUNE_WORKER_REFINE = (3, 6, 12, 24, 48, 96)
# Configurations whose medians (two runs or more each) differ by less than this share of the noise are
# tied, and the cheapest of them wins. The noise is the typical spread of two runs, about 1.1 standard
# deviations of one run; half of it keeps what a tie can cost under 3% at the usual 3-6% noise.
TUNE_TIE_SHARE_OF_NOISE = 0.5
# The winner is confirmed against your configuration in this many alternated pairs of runs: the
# speed-up reported is their median ratio with its range. One run of the winner is the luckiest of the
# search (the image-folder script: "1.74x" from one run against a baseline with 23% spread measured
# 1.20x by its own timer); alternated pairs cancel the drift of a shared machine between them.
TUNE_CONFIRM_PAIRS = 2
# The command's processes used at least this share of every core: the input pipeline cannot get more
# CPU, so loading in the training process (num_workers=0, no pickling between processes) is tried.
# SageMaker's CPUBottleneck rule counts a core over 90% as saturated (docs/sources.md).
TUNE_CORES_FULL_SHARE = 0.90
# A fix that did not help (persistent workers, say) is tried again once its cause has grown this much:
# worker start-up took 10% of a short-epoch run with 1 worker and 49% with 8 (2 cores, cpu_bound.py),
# and persistent workers lost at 1 worker and won by 27% at 8.
TUNE_CAUSE_RETRY_FACTOR = 2.0
# The what-if model's pick, measured, is within this much of what the model predicted for it (relative
# to your run, beyond the noise): the model is right on this job, and the worker ladder it already
# searched is not climbed again. Its median error over the what-if bench's 48 settings is 7.7-11% (the
# last two runs), and at most 20% per workload (bench/results/what_if.md, 2026-12-02 07:01 and 16:31).
TUNE_MODEL_AGREEMENT = 0.15
# ...and the one point past its pick that is still measured has this many times its workers (at most
# the cap): nearer points hide a slow rise in the noise, or a dip. Far-too-many-workers bench,
# 2026-12-02: the model's pick 2 persistent workers (its predictions flat up to 16), measured 668-688
# samples/s; 4 workers within the noise of it, 8 workers 637-660, 16 workers 773-786.
# Where the model ties settings because the cores bind a threaded CPU step, its pick is the most
# workers it ties with its best, up to this many times its best's (the same reach: that bench's curve
# kept rising up to 16 while the model was flat).
TUNE_MODEL_CHECK_FACTOR = 8
# Deeper prefetch is tried once the best configuration still waits for data at least this much.
TUNE_PREFETCH_CHOICES = (2, 4)
# Host memory: the worker ladder does not climb to a rung whose extra workers (each as much private
# memory as the measured runs' largest worker held) would take more than this share of the memory the
# host had available during the run with the most workers (tf.data AUTOTUNE's RAM budget is half the
# available memory, core/framework/model.cc; --autotune's guard is the same, AUTOTUNE_RAM_BUDGET_SHARE):
# a worker's private memory read at the end of a trial of seconds is a lower bound of what it holds later
# in a long run, where its copy-on-read growth can reach the dataset's Python objects (pytorch#13246)...
TUNE_MEMORY_BUDGET_SHARE = 0.5
# ...nor to one that would leave less than this share of the host's memory available (the kernel's OOM
# killer ends the largest process when memory runs out: --autotune's AUTOTUNE_MIN_AVAILABLE_SHARE).
TUNE_MEMORY_MIN_AVAILABLE_SHARE = 0.10
# tf.data (gpufeed tune on a TensorFlow script): num_parallel_calls tried on the way up, from 2 (the
# script's own sequential map is the baseline) to the same per-core cap as workers, since a stage
# that waits on storage (or a Python call that sleeps) scales past the cores as workers do; the
# refinement adds the points between. tf.data.AUTOTUNE is always measured beside them.
TUNE_TF_PARALLEL_LADDER = (2, 4, 8, 16, 32, 64, 128)
TUNE_TF_PARALLEL_REFINE = (3, 6, 12, 24, 48, 96)
# A trial with no batch for this long is stopped as hung.
TUNE_STALL_TIMEOUT_S = 30.0
# A trial is stopped as failed after start-up + factor x its measured seconds + the stall timeout:
# importing torch and starting workers takes seconds; a warm-up at the slowest configuration
# can take as long as the measurement several times over.
TUNE_TRIAL_START_S = 60.0
TUNE_TRIAL_TIME_FACTOR = 10.0

# -- Memory (analysis/rules/memory.py, gpufeed batch-size) ---------------------------------------------
# allocator_cache: what nvidia-smi shows is mostly the caching allocator's free blocks once reserved
# memory is 1.5x the peak of live tensors and the difference is worth a user's attention (1 GiB,
# or 10% of the device): below that the cache is ordinary allocator slack.
ALLOCATOR_CACHE_RATIO = 1.5
ALLOCATOR_CACHE_MIN_B = 2**30
ALLOCATOR_CACHE_MIN_SHARE = 0.10
# batch_too_small: the run's peak used less than half of the device, so at least twice the batch
# fits (memory = a + b x batch, a > 0); SageMaker's BatchSize rule also asks for GPU utilization
# p95 < 70% (a busy GPU gains little from a larger batch).
BATCH_HEADROOM_MAX_SHARE = 0.5
BATCH_HEADROOM_GPU_UTIL_P95_PCT = 70.0
# memory_growth / worker_memory_growth: memory rising step after step, steadily (R^2 of a straight
# line over the window at least 0.8: a sawtooth of allocations is not a leak), by at least 10% of
# where it started and at least 64 MiB (below that a warm-up of caches looks the same), over at
# least 5 readings. SageMaker's GPUMemoryIncrease fires on a 5-point rise of the moving average.
MEMORY_GROWTH_MIN_R2 = 0.8
MEMORY_GROWTH_MIN_SHARE = 0.10
# Copy-on-read is claimed when a worker's shared pages fell by at least half of what its private ones
# rose: a forked page written by the worker moves from shared to private (pytorch/pytorch#13246); the
# rest of a rise is memory the worker allocated itself, which shared memory does not show.
COPY_ON_READ_SHARED_SHARE = 0.5
MEMORY_GROWTH_MIN_B = 64 * 2**20
MEMORY_GROWTH_MIN_POINTS = 5
# shm_too_small: a DataLoader worker collates each batch straight into /dev/shm, and it stays there
# until the loop lets go of it: besides num_workers x prefetch_factor batches in flight, /dev/shm held
# 2 more at its peak, measured here (df polled every 10 ms, batches of 2 MiB, 2 workers: prefetch_factor
# 1 peaked at 8.1 MiB = 4.0 batches, prefetch_factor 4 at 20.1 MiB = 10.0 batches): the batch the loop
# holds and one being made or handed over. Once they outgrow the free space the workers die ("Bus
# error", pytorch/pytorch#5040, #108861; torch 2.x: "unable to allocate shared memory ... No space
# left on device"); Docker's default /dev/shm is 64 MB.
SHM_BATCHES_HELD = 2
# It is flagged once what the training loader needs reaches half of what was free: the first batch
# is the one measured, and a later one can be larger (variable-length samples padded to the longest),
# an evaluation loader's workers share the same /dev/shm, and the crash comes without warning; a
# need above the free space is a failure, not a risk (high severity).
SHM_NEED_SHARE_FLAG = 0.5
# Docker's default --shm-size (64 MB): the size the advice rounds a suggested --shm-size up to multiples of.
SHM_DOCKER_DEFAULT_B = 64 * 10**6
# gpufeed batch-size: the share of capacity the largest batch may use (default): headroom for the
# allocator's fragmentation, the CUDA context and longer samples later in training. YOLOv5's
# autobatch aims at 80% of free memory; the PyTorch Profiler plugin flags peaks above 90%.
BATCH_TARGET_SHARE = 0.90
# A straight line fits memory against batch size when R^2 >= 0.98; below, the tool says memory is
# not linear and falls back to a bisection on measured trials.
BATCH_FIT_MIN_R2 = 0.98
# The fit's largest batch is rounded to this many decimals before it is floored: the least-squares
# slope carries float noise in its last bits (numpy 2.4 fits (1,10),(2,12),(4,16) with a slope of
# 2.0000000000000004), which must not move a batch that lands exactly on the limit to the one below.
# A millionth of a sample's memory is far above that noise (~1e-15 relative) and far below the peaks'
# scatter around the line, which the search subtracts first.
BATCH_FIT_PREDICT_DIGITS = 6
# Points whose peaks differ by less than 2% of the limit tell nothing about the slope (the process's
# fixed memory dominates): the search doubles the batch instead of extrapolating.
BATCH_FIT_MIN_SPREAD_SHARE = 0.02
# The search stops once the largest batch that fits is within 3% of the smallest that does not
# (or of the fit's prediction): inside 5% of the true largest batch, without trials of +1 steps.
BATCH_SEARCH_TOLERANCE = 0.03
# Trials at most (Lightning's binsearch allows 25; halving and doubling plus a fit rarely need 8).
BATCH_MAX_TRIALS = 12
# A trial measures this long after its warm-up steps: the peak comes in the first steps; the
# throughput needs a few more.
BATCH_TRIAL_SECONDS = 2.0
BATCH_TRIAL_WARMUP_STEPS = 3
# The knee: the smallest batch whose throughput is within 5% of the best measured (differences
# below that are run-to-run noise on a shared machine, see TUNE_NOISE_FLOOR and bench/results).
BATCH_KNEE_TOLERANCE = 0.05

# -- what if (analysis/whatif/, docs/what-if.md) -------------------------------------------------------------
# Fewest measured steps (and worker batches) to predict from: below this the per-batch quartiles
# that give the prediction its range are not quartiles (issue 15: "too few steps: cannot predict").
WHATIF_MIN_STEPS = 20
# num_workers=0: the probe takes the CPU time of one batch in 8 (docs/run-record.md); at least this
# many such readings give the CPU part of a batch.
WHATIF_MIN_TIMED_BATCHES = 3
# Sampler readings (10 Hz) of the training process inside the window: its CPU per step.
WHATIF_MIN_SAMPLES = 3
# Epoch periods of non-persistent workers (one iterator's creation to the next) the model needs to read
# an epoch's start-up from them: one alone may be an epoch slowed by a passing program.
WHATIF_MIN_EPOCH_PERIODS = 2
# The what-if model takes a worker's share waiting for a core (its sampler readings in state R inside
# fetches, the cores full) at the lower bound of its 95% Wilson interval: a few readings over-read it
# (26 readings of 2 workers read 35% runnable where their CPU was 9% of the fetch, bench/what_if.py's
# short-epochs record, 2026-12-03).
WHATIF_RUNNABLE_Z = 1.96
# An idle OpenMP thread of the training step spins this long after the step's last parallel region
# before it sleeps (libgomp's default wait policy spins GOMP_SPINCOUNT = 300,000 times, a time that
# depends on the CPU). With num_workers=0 the other threads' CPU inside next() read 4.0 ms a batch in
# bench/omp_spin.py, 8.3 ms in bench/what_if.py's CPU-bound record and 9.3 ms in the Hugging Face
# Trainer script of tests/real, on this 2-core VM, none of it the batch's work (their batches cost no
# more in a worker than on the training thread).
WHATIF_OMP_SPIN_S = 0.010
# next() on a batch that is already made costs the receive (the queue, unpickling): the low end of
# the measured waits (the 5th percentile: in an input-bound run most waits include production).
WHATIF_RECEIVE_QUANTILE = 5
# ... capped here: a batch already made costs 0.1-0.5 ms to receive in the bench's records (2 cores);
# a low end above 1 ms means the loop never found a batch ready, and says nothing about the receive.
WHATIF_RECEIVE_MAX_S = 0.001
# A step whose batch was ready (next() took at most this: the receive above) runs as in a loop that never
# waits. After a long wait the same step runs slower (the CPU idled: cold caches, the step's threads asleep):
# bench/what_if.py's storage record (2 workers, 2 cores, 2026-12-02) took 1.07 ms a step after waits of
# 1-5 ms and 5.44 ms after waits over 20 ms; 16 workers, whose loop rarely waited, 0.58 ms.
WHATIF_READY_WAIT_S = WHATIF_RECEIVE_MAX_S
# ... and where fewer were ready, the steps after the run's shortest waits (this lowest share of them):
# the storage record above had 2 ready steps in 174.
WHATIF_READY_QUANTILE = 25
# The GPU's own step on a GPU run (CUDA events): the host's period per step less the GPU's idle in its
# next() is the GPU's step on the mean only, since the host runs ahead of the device (CUDA's launch queue,
# bounded by the caching allocator and by the loop's own waits such as loss.item()) and then waits for
# it all at once: a loop that queues 7 steps in 2 ms each and waits 130 ms on the 8th has per-step
# quartiles of 2 ms for a 20 ms GPU step. The range takes the quartiles of the means of this many
# consecutive steps: twice such an 8-step cycle. A loop that runs further ahead than that widens the
# range (its blocks differ more); the mean, which gives the prediction, is the steps' own either way.
WHATIF_GPU_STEP_BLOCK = 16
# Other programs' CPU (host busy minus the command's tree) is taken off the cores, up to this share of
# them: the sampler's two readings are taken at slightly different moments and can overstate it.
WHATIF_MAX_OTHER_SHARE = 0.75
# A worker's CPU per batch outside its fetch (pickling the batch, the queues), when the run cannot
# show it (no workers, or workers started again every epoch, whose start-up CPU would count too):
# 0.5-0.8 ms per batch of 16 samples in the persistent-worker runs of bench/what_if.py (2 cores).
WHATIF_HANDOFF_S = 0.0007
# Starting and stopping a DataLoader worker, per worker, where the run cannot show it (no workers,
# or persistent ones): forking a torch process (the iterator's creation to its workers started) and
# shutting it down (the next() that ends an epoch, without persistent workers). 8-13 ms and 4-10 ms
# per worker (w2-w16) in the non-persistent runs of bench/what_if.py, 2026-11-30 (2 cores, ~300 MB
# training processes); a larger process forks slower (page tables are copied).
WHATIF_WORKER_SPAWN_S = 0.010
# Stopping them is not one worker after the other: torch tells them all to exit, then joins each,
# and they exit together. The next() that ends an epoch took 21-30 ms with 1 worker, 19-33 ms with 2,
# 30-43 ms with 4 and 98-112 ms with 16 (bench/what_if.py's records of 2026-12-02/03, storage,
# short-epochs and far-too-many workloads, 2 cores): about 6 ms a worker plus as much as 2 workers
# more (`WHATIF_WORKER_STOP_S` is that per-worker part). Counted 16 ms a worker, as the 2 workers of
# a record took, 16 workers would have stopped in 260 ms instead of 107.
WHATIF_WORKER_STOP_S = 0.006
WHATIF_STOP_FIXED_WORKERS = 2.0
# The most a minor page fault costs the step (a copy-on-write fault: the fault and a 4 KiB copy). The
# probe's fork (measure/inside/forking.py) counts the faults of the two steps it slows; a step that
# other processes preempted meanwhile took longer without copying more, so the copy-on-write it gives
# is at most its faults times this. Measured on 2 cores (a VM): 10.5 us a fault in plain torch (the
# compute-bound model's first step after a fork, 91 ms beyond the step for 8,700 faults) and 7 us in
# bench/what_if.py's compute-bound record; twice the higher.
WHATIF_MAX_FAULT_S = 20e-6
# A sampler interval is contended when other programs kept at least this many cores busy while
# fewer than WHATIF_CONTENDED_IDLE_CORES stayed idle: the job's steps slow down there (1.3 ms alone,
# 20-25 ms while another program held a core, in bench/what_if.py's storage run of 2026-11-30 on
# 2 cores), which is the other programs' doing, not the job's cost. Such intervals are left out of
# the costs while the quiet rest holds at least WHATIF_MIN_QUIET_SHARE of the window.
WHATIF_CONTENDED_OTHER_CORES = 0.5
WHATIF_CONTENDED_IDLE_CORES = 0.5
WHATIF_MIN_QUIET_SHARE = 0.3
# The least share of the cores the job is taken to get, whatever other programs used during its run.
WHATIF_MIN_FREE_CORES = 0.25
# Settings predicted within this share of the fastest are equal; the fewest workers win (the tune's
# tie rule, loadtune's 2%: field-facts.md).
WHATIF_TIE_SHARE = 0.02
# The least uncertainty a prediction carries beyond its cost quartiles: the tune's noise floor.
WHATIF_NOISE_FLOOR = 0.03
# A term the run did not measure (Costs.assumed: hand-off, forking, stopping workers) is a default from
# one 2-core VM; a prediction's range covers it at half and twice its value. There it spanned 0.7-1.4x
# (h 0.5-0.8 ms for 0.7; k 8-13 ms for 10; z 5-10 ms for 6, above), and a CPU half or twice as fast, or
# a process that forks at twice the size, moves it by about 2x more.
WHATIF_ASSUMED_LOW, WHATIF_ASSUMED_HIGH = 0.5, 2.0
# A rule sizes its advice from the model (too_few_workers' worker count) only where the model's
# prediction of the run's own settings is within this share of what the run measured: every workload
# of bench/what_if.py's held-out set was within 20% (docs/what-if.md); beyond it the model is not
# describing this run.
WHATIF_SIZING_MAX_ERROR = 0.20

# -- Reliability: stopping the command, and what a run must measure to be judged --------------------
# Time the command gets to end by itself once gpufeed asks it to stop (Ctrl-C, SIGTERM to gpufeed,
# a stall): long enough for a framework's own handler to save a checkpoint of a small model, short
# enough that a stuck command does not keep a terminal. Docker's `docker stop` waits 10 s,
# Kubernetes 30 s, systemd 90 s; Ctrl-C is interactive, so less. `--grace S` changes it.
STOP_GRACE_S = 5.0
# An iterator's first batch waits for the workers to start (spawn start-up imports the script's
# modules and torch afresh in each worker: seconds to tens of seconds) and for a shuffle buffer or
# a cache to fill: it gets its own limit, ten times the default stall timeout, before it counts as
# a stall. `--first-batch-timeout S` changes it.
FIRST_BATCH_TIMEOUT_S = 600.0
# Findings need this many measured steps (after the warm-up): a share or a percentile of fewer
# steps is one or two batches' accident (a slow first read, a cache miss), and a run that crashed
# or stalled after two steps has measured nothing about its steady state. Ten steps put p50 on
# the middle of ten values; the rank rules ask for twice as many (IMBALANCE_MIN_VALUES).
MIN_STEPS_FOR_FINDINGS = 10

# -- autotune (gpufeed/autotune, docs/autotune.md) ----------------------------------------------------------------
# A decision period lasts at least as long as a tune trial measures (TUNE_TRIAL_SECONDS) and at
# least this many batches: a trial's throughput on fewer batches is one or two batches' accident.
AUTOTUNE_PERIOD_MIN_BATCHES = 10
# Your settings' first half period ends at AUTOTUNE_PERIOD_MIN_BATCHES where the loop waited for its
# workers at least this share of it, and stands for both halves (their spread, the search's first noise,
# is its own halves'); it counts from the pool's prefetched batches, not after the run's warm-up: time at
# your settings is paid at their speed, the costliest of the run when they starve it (the storage bench:
# a tenth of the winner's, for 1.5 s of a 10 s run, then 0.7 s for two halves after the warm-up), and the
# search's first decision is not close there (a wait of half the time removed doubles the rate), while a
# loop that waits for its workers runs at their rate whatever its first steps cost. Only with workers: without,
# the wait is the loop making its batches, and on busy cores workers would take as long (the CPU-bound
# bench, num_workers=0 the best: with this rule and tune/model_start.py's cold step applied to it, 2 of 6
# runs settled on 12-20 workers, 2026-12-06; none of 3 before).
AUTOTUNE_STARVED_SHARE = 0.5
# The live search stops (and keeps your settings) once the what-if model's pick and other trials, this
# many in all, measured no faster than your settings beyond the noise: the model was wrong about this
# job, and each further period below your settings (and the one back at the best after it) is paid by
# the training run. The walk up the ladder stops at two rungs without a rise for the same reason. On the
# CPU-bound bench (2026-12-06) the model's pick (2 workers, +25% predicted) measured -4% and the next
# rung -34%; the eight trials that followed found 3 workers within the noise of your 0, at the cost of
# periods down to -34% and the switches between them.
AUTOTUNE_TRIALS_WITHOUT_GAIN = 2
# Once settled, the winner's periods are compared with the median of its last this many (about a
# minute at the default 4 s period): long enough that a period's noise does not move it, short enough
# that a rate that changed for good an hour ago is the reference now.
AUTOTUNE_WATCH_PERIODS = 15
# The loop starts searching once it waits for data as much as a flagged data wait (the same 5% as
# DATA_WAIT_SHARE_FLAG): below that, no DataLoader setting can buy more than the noise.
AUTOTUNE_SEARCH_WAIT_SHARE = DATA_WAIT_SHARE_FLAG
# Host memory: tf.data AUTOTUNE's RAM budget is half of the available memory (tensorflow
# core/framework/model.cc, ram_budget), and OOM under AUTOTUNE is its users' main complaint
# (tensorflow#33516, #36821). More workers or a deeper prefetch is tried only when its estimated
# extra memory (each new worker's private memory, each new queue slot's batch) fits in this share
# of what the host has available...
AUTOTUNE_RAM_BUDGET_SHARE = 0.5
# ...and never while less than this share of the host's memory is available at all: the kernel's
# OOM killer ends the largest process (often the training process, or a worker) when it runs out,
# and each worker's copy-on-read growth can reach the size of the dataset's Python objects
# (pytorch/pytorch#13246), which no estimate made at a worker's start sees.
AUTOTUNE_MIN_AVAILABLE_SHARE = 0.10
# A new worker's memory is estimated as the average private memory of this many of the pool's workers:
# each read walks a process's page tables (70-90 ms for all 24 idle workers of the storage bench's
# pool on its 2 cores, 2026-12-06), and workers of one pool run the same code on the same data.
AUTOTUNE_MEMORY_SAMPLE_WORKERS = 4
# A worker killed just after it queued a batch can surface as a ConnectionResetError (the batch's
# shared memory is fetched from the dead process) before the kernel has reaped it: the autotuner
# waits this long for the death to show before it calls the error the user's own. A SIGKILLed
# process is reaped within milliseconds; a second covers a loaded machine.
AUTOTUNE_WORKER_REAP_GRACE_S = 1.0
# Several ranks (autotune/ranks.py): at each decision's exchange through the job's store, rank 0
# waits this long for every rank's period (and the others twice as long for its decision) before
# every rank goes back to your settings. Ranks of a synchronous job reach the same batch within a
# step of each other; the margin is for a rank 0 that checkpoints or evaluates alone while the
# others wait (at an exchange instead of the all-reduce: minutes), and it is what a survivor of a
# job without collectives waits when a rank dies (in DDP the survivors stop at the collective).
AUTOTUNE_SYNC_TIMEOUT_S = 300.0
# ...and rank 0 waits this long at an exchange for the search's next request (its thread decides
# in milliseconds once it has the period): else the window goes on to the next exchange.
AUTOTUNE_ASK_WAIT_S = 1.0

# -- Offloading the training DataLoader to Ray (gpufeed/offload/, docs/offload.md) -----------------
# Batches in flight per Ray worker when the loader sets no prefetch_factor: torch's own default (2).
OFFLOAD_PREFETCH_FACTOR = 2
# How long the Ray workers get to start (a cold node imports torch and the user's code; a node that
# pulls a runtime environment takes longer): past it, offloading goes on with those that started,
# or, none, is refused before training starts.
OFFLOAD_START_TIMEOUT_S = 120.0
# A Ray worker not started after this long while the cluster has a CPU free for it is started again:
# its creation was lost. Seen here with Ray 2.60 on one node: an actor created right after others
# were killed was never registered with the GCS (its sibling, created a millisecond later, was), and
# the pool waited out OFFLOAD_START_TIMEOUT_S with a CPU free (the same kind of race as
# ray-project/ray#17369). Longer than a worker's start on a loaded 2-core machine (importing torch:
# 2-5 s), so a slow start is never taken for a lost one.
OFFLOAD_STUCK_START_S = 15.0
# How long closing the pool waits for its workers still starting to start (one killed while Ray places
# it can keep its CPU: ray_engine.Pool.close), and then for the killed ones to be gone, so that a pool
# started next (the next run on a shared cluster, a test) finds their CPUs free.
OFFLOAD_CLOSE_WAIT_S = 5.0
# A batch whose making killed Ray workers on this many nodes is the batch's fault, not the cluster's:
# its error is raised, as torch raises when a DataLoader worker dies. (Per node: a node's other
# workers die with it, and the batch may have been sent to one of them before that was known.)
OFFLOAD_MAX_ATTEMPTS = 3
# Lost workers replaced in one run, per worker of the pool, before the pool stops replacing them.
OFFLOAD_MAX_REPLACEMENTS_PER_WORKER = 4
# With every Ray worker lost, how long to wait for a replacement before the cluster counts as lost
# and the epoch goes on with local workers. Ray itself declares a node dead after missing 5 health
# checks 3 s apart (its health_check_failure_threshold and health_check_period_ms defaults), so the
# wait starts only once Ray has said so.
OFFLOAD_LOST_AFTER_S = 30.0
# The run record gets the offload totals so far every this many batches (and at the end).
OFFLOAD_RECORD_EVERY = 64
# How long the process holding the Ray connection gets to stop when told to (it kills its pool's
# actors, and a local Ray started for the run stops with it: a few seconds on a loaded machine);
# past it, it is killed (a local Ray's processes die with it: Ray ties their lives to their driver's).
OFFLOAD_DRIVER_CLOSE_S = 15.0


# -- Advice in proportion (``analysis/selfcheck.py``, ``analysis/offload_sizing.py``) -----------------------------
# Offloading to a Ray cluster is advised only when the step alone (the what-if ceiling) is at least this
# many times what the best local setting reaches: a cluster brings nodes to pay for, a network hop and
# serialisation per batch (docs/offload.md), which a gain of a few tens of percent rarely repays; a
# larger host or cheaper samples get that much more simply. Cachew (ATC 2022) adds one remote worker at
# a time and only while it buys > 7%: 1.5x is six such steps.
OFFLOAD_ADVICE_MIN_GAIN = 1.5
# A DataLoader fix is offered only when its predicted gain clears the run's own noise (the what-if noise,
# at least WHATIF_NOISE_FLOOR): a change predicted within the noise would be a guess. The point prediction
# must clear it, not only its range's upper end (a loaded host's 0.99x, 0.70-1.30x, was offered so).
# And a headline of COMPUTE is contradicted when a fix is predicted to gain more than this, at its low
# end: the input pipeline then costs more than the wait shows (the self-check says so and why).
SELFCHECK_CONTRADICTING_GAIN = 1.10
# A part of the time is said in a finding only once it reads at least 1% as findings print shares
# (``{:.0%}``, half a percent and up): below that it would read "0% of the time", a cost nobody can act on.
# What in-order delivery cost (slow_samples: said, and in_order=False offered for it, from here; its
# predicted gain, 1 / (1 - share), is then at least 1.005x) and what restarting workers cost each epoch
# (wording.py: said beside the wait from here).
SHARE_SAID_MIN = 0.005


# -- Inside the batch: slow samples, in-order delivery, the wait by stage (analysis/batches.py) -----------
# A sample is slow once it takes 4x the median sample and at least 1 ms: the workers name each batch's
# samples above the same bar (measure/inside/patches.py), so the tail is kept small. MinatoLoader
# (EuroSys 2026, arXiv 2509.10712) shows one slow sample holding its whole batch, and in-order delivery
# keeping every later batch waiting behind it.
SLOW_SAMPLE_FACTOR = 4.0
SLOW_SAMPLE_MIN_S = 0.001
# Slow samples split at the largest gap in their times when one is at least twice the next: the group
# above is the slow kind (80 ms samples stood apart from 1 ms reads stretched to 5-20 ms on a saturated
# 2-core machine, measured here); without such a gap all of them are named.
SLOW_GROUP_GAP = 2.0
# The slow indices follow a rule (index % m == r) when it covers at least half of the slow samples' time
# beyond the median sample: on a saturated 2-core machine 1 ms reads stretched up to 130 ms here, beside
# the 80 ms samples of the rule; the rule is looked for among the first 500 slow indices.
SLOW_RULE_MIN_EXCESS_SHARE = 0.5
SLOW_RULE_MAX_INDICES = 500
# The finding names at most this many slow indices (and the rule they follow, where there is one).
SLOW_SAMPLES_NAMED = 12
# slow_samples fires when the loop's wait for batches holding a slow sample costs this share of the
# wall time: the bar of a loss worth a finding (BOTTLENECK_MIN_SHARE, TensorFlow's 5%).
SLOW_SAMPLE_WAIT_SHARE_FLAG = DATA_WAIT_SHARE_FLAG
# A step is matched to its worker's batch by torch's round-robin; the match is dropped when more than
# 5% of the batches would be delivered before their worker finished them (2 ms slack: the two
# processes read one monotonic clock, but a fetch row ends after its batch is collated).
MATCH_SLACK_S = 0.002
MATCH_MAX_LATE_SHARE = 0.05

# -- The user's code in the workers (analysis/rules/user_code.py) -----------------------------------------
# user_code_hotspot: one function of the user's own files holds most (half or more) of the workers' CPU
# samples while the loop waits for data (the issue's "holds most of the workers' time"); at least 20 CPU
# samples (0.2 s of the workers' CPU at the profiler's 10 ms), below which a share is noise.
USER_CODE_HOTSPOT_SHARE = 0.5
USER_CODE_MIN_SAMPLES = 20
# Where the workers' waiting is sampled (the wall-clock sampler), the share is of their time making batches
# (CPU + waiting in the user's code), and the fix follows what holds more than half of the function's time:
# its waiting (storage, sleep, a lock) or its CPU.
USER_CODE_WAITING_SHARE = 0.5
