"""The decode worker pool: a one-token step's products shared with spinning worker threads.

A decode step of a small model is ~120 products of 0.1-3 MB of weights each. numba's
parallel regions cost ~15-20 us each (TBB layer; OpenMP's join stalls whenever a worker is
descheduled), so such products ran on one thread and a second core did nothing. The pool
replaces regions with a job word in shared memory:

- while a step runs (`DecodePool.running`), each worker thread sits in a jitted spin loop
  (kernels.decode.layer.serve, GIL released) watching the job word;
- the thread that runs the step publishes each product as a job (which product group, in
  how many chunks), then claims chunks itself like any worker; a worker claims the rest. A
  claim is a compare-and-swap of the whole job word, so a claim succeeds only for the job
  whose parameters it read, and a chunk is never computed twice or for a stale job;
- the publisher waits until every claimed chunk is done. A descheduled worker delays only
  chunks it already claimed: unclaimed ones go to whoever is running, so a busy core costs
  at most its share (the robustness of TBB's work stealing, at ~0.1 us per hand-off
  instead of ~15 us);
- after a step the workers keep spinning for ~3 ms (IDLE_TICKS), so back-to-back steps of a
  generation find them running on their own cores (a worker woken every token is first
  placed on the waking thread's core by the scheduler, and both then share one core until
  it is moved), then return to Python and sleep on an event; `rest()` sends them to sleep
  at once (before a prefill, whose BLAS threads need the cores).

Two kinds of job: a *product group* (kernels.decode.block: 3 matrices of one input, the group id
indexes the pool's groups; its publisher puts the addresses of the activation and the output in the
args block, so the chunks read and write the caller's arrays in place) and a *task*: a plugin's
jitted function value compiled for kernels.decode.parts.SIGNATURES["task"], fn(args int64[ARG_SLOTS], chunk),
registered with the pool
when it is built (`tasks`; once per model, never per token). A task's publisher writes its
arguments into the pool's args block (ctrl[ARGS:]: array addresses from kernels.decode.addresses,
integers, float bits) and publishes it with `publish_task`; whoever claims chunk c calls
fn(args, c). A task's result must not depend on which thread ran a chunk (each chunk writes
only its own outputs; the publisher combines them in chunk order).

While it has no chunk to compute (the step's thread is in attention, norms, activation quantization or the
Python between layers and tokens), a worker reads ahead: it prefetches the weights of the product groups
after the last one it saw (group ids follow the step's order; after the last group it wraps to the first, the
next token's), up to the pool's READ_AHEAD field (read_ahead bytes, in 64-byte lines), READ_AHEAD_SLICE lines
between two looks at the job word. Memory then streams while the step's own work runs, and the next
products find their weights in the caches (SmolLM2-135M Q4_1, Zen 4, 2 threads: ~143 -> ~150 tok/s). A
prefetch is a hint: no result depends on it.

Job word layout (int64): gen << 40 | group << 16 | n_chunks << 8 | next_chunk (group: a product
group id, or TASK_BIT | task id). gen makes a word unique over 2^23 jobs (no ABA between a
worker's read and its claim).

ctrl fields sit on separate cache lines (8 int64 apart): JOB, DONE (chunks finished), SLEEP
(1: return to Python), N and N_IN (the job's activation shape), THREADS (threads in the step),
WORKER_CHUNKS (chunks the workers computed, a statistic; WORKER_TASK_CHUNKS: of tasks), BACKOFF
(tasks not to share after a stall, see `share_task`), ROWS (1: the workers hold the model's dense
layers and take ROWS_JOB, the attention of a batch's sequences), READ_AHEAD (the read-ahead in lines); then
the args block of a task (ARG_SLOTS int64 from ARGS).

A third kind of job, ROWS_JOB, shares the attention of a multi-row step (kernels.decode.layer.decode_rows):
rows of different sequences attend independently, so each chunk is one sequence's run of rows. The
workers then need the dense layers' typed list (`layers`, given when the pool is built).

A task's chunks are long (~0.1-0.2 ms of streaming), so on an overloaded host
a worker is often descheduled while it holds one, and the publisher waits until it runs again
(milliseconds). A publisher that waited longer than STALL_TICKS for its task's chunks
(`wait_task`) computes the next BACKOFF_TASKS tasks alone (`share_task` says no): the same bits,
and at most one stall per BACKOFF_TASKS tasks while the host stays overloaded.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numba
import numpy as np
from numba import njit

from archrun.kernels import atomics
from archrun.kernels._jit import JIT, QB
from archrun.kernels.decode.lists import typed_list
from archrun.kernels.decode.parts import SIGNATURES

JOB, DONE, SLEEP, N, N_IN, THREADS, WORKER_CHUNKS, WORKER_TASK_CHUNKS, BACKOFF, ROWS, READ_AHEAD = (
    0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80)
ARGS, ARG_SLOTS = 88, 64  # a task's arguments: ctrl[ARGS:ARGS + ARG_SLOTS]
CTRL_SIZE = ARGS + ARG_SLOTS
_GEN_SHIFT, _GID_SHIFT = 40, 16
_GEN_MASK = (1 << 23) - 1
MAX_CHUNKS = 255
TASK_BIT = 1 << 23  # a job's group field: a task id when this bit is set, else a product group id
MAX_GROUPS = TASK_BIT
MAX_TASKS = TASK_BIT - 1
# a job's group field for the attention of a batch's rows (kernels.decode.layer.attend_rows): one chunk per
# sequence's run of rows, the layer and the rows' arrays in the args block
ROWS_JOB = 2 * TASK_BIT - 1
# how long a worker with no job keeps spinning before it sleeps: time-stamp ticks (x86, ~3 ms
# at 2.5 GHz) and, where there is no time-stamp counter, spins
IDLE_TICKS = 8_000_000
IDLE_SPINS = 1 << 20
# a task's wait for claimed chunks beyond which its publisher computes the next BACKOFF_TASKS tasks
# alone (time-stamp ticks: ~1 ms at 2.5 GHz, several chunks' time; a descheduled worker costs more)
STALL_TICKS = 2_500_000
BACKOFF_TASKS = 64

# a worker with no chunk to compute reads the weights of the next product groups ahead
# (kernels.decode.block.prefetch_group): up to READ_AHEAD_BYTES past the last group it saw (the pool's
# READ_AHEAD field, in 64-byte lines), READ_AHEAD_SLICE lines between two looks at the job word
READ_AHEAD_BYTES = 4 << 20
READ_AHEAD_SLICE = 128

_STEP = dict(JIT, inline="always")


@njit(**_STEP)
def active(ctrl) -> bool:
    """Whether a pool is running a step (an inactive pool is an empty ctrl)."""
    return ctrl.shape[0] == CTRL_SIZE and ctrl[THREADS] > 1


@njit(**_STEP)
def publish(ctrl, gid, n_chunks, n, n_in):
    """Make product group `gid` (n_chunks chunks, activation [n, n_in]) the current job."""
    atomics.store(ctrl, N, n)
    atomics.store(ctrl, N_IN, n_in)
    atomics.store(ctrl, DONE, 0)
    gen = ((atomics.load(ctrl, JOB) >> _GEN_SHIFT) + 1) & _GEN_MASK
    atomics.store(ctrl, JOB, (gen << _GEN_SHIFT) | (gid << _GID_SHIFT) | (n_chunks << 8))


@njit(**_STEP)
def claim(ctrl):
    """(chunk, job word) of a chunk claimed from the current job; chunk -1: none left, -2: lost a race."""
    w = atomics.load(ctrl, JOB)
    c = w & 255
    if c >= (w >> 8) & 255:
        return -1, w
    if atomics.cas(ctrl, JOB, w, w + 1):
        return c, w
    return -2, w


@njit(**_STEP)
def job_group(w):
    """The job's product group id, or TASK_BIT | task id."""
    return (w >> _GID_SHIFT) & (2 * TASK_BIT - 1)


@njit(**_STEP)
def job_chunks(w):
    return (w >> 8) & 255


@njit(**_STEP)
def done(ctrl):
    """One claimed chunk finished."""
    atomics.add(ctrl, DONE, 1)


@njit(**_STEP)
def worker_done(ctrl):
    """One chunk claimed by a worker finished."""
    atomics.add(ctrl, WORKER_CHUNKS, 1)
    atomics.add(ctrl, DONE, 1)


@njit(**_STEP)
def wait_done(ctrl, n_chunks):
    """Spin until all n_chunks chunks of the current job are finished."""
    while atomics.load(ctrl, DONE) < n_chunks:
        atomics.pause()


@njit(**_STEP)
def publish_task(ctrl, task, args, n_chunks):
    """Make task `task` (n_chunks chunks, arguments args int64 [<= ARG_SLOTS]) the current job;
    returns the pool's copy of args (what every chunk, the publisher's too, reads)."""
    shared = ctrl[ARGS:ARGS + args.shape[0]]
    shared[:] = args
    publish(ctrl, TASK_BIT | task, n_chunks, 0, 0)
    return shared


@njit(**_STEP)
def shares_rows(ctrl) -> bool:
    """Whether the running pool ctrl takes ROWS_JOB (its workers hold the model's dense layers)."""
    return active(ctrl) and ctrl[ROWS] != 0


@njit(**_STEP)
def publish_rows(ctrl, args, n_chunks):
    """Make the attention of a batch's rows (args int64 [<= ARG_SLOTS], n_chunks runs) the current job;
    returns the pool's copy of args."""
    shared = ctrl[ARGS:ARGS + args.shape[0]]
    shared[:] = args
    publish(ctrl, ROWS_JOB, n_chunks, 0, 0)
    return shared


@njit(**_STEP)
def share_task(ctrl) -> bool:
    """Whether to share the next task with the running pool ctrl: it runs, and no stall backoff is on
    (each refusal counts one task of the backoff down). Called by the thread running the step only."""
    if not active(ctrl):
        return False
    b = ctrl[BACKOFF]
    if b > 0:
        ctrl[BACKOFF] = b - 1
        return False
    return True


@njit(**_STEP)
def wait_task(ctrl, n_chunks):
    """wait_done for a task's chunks; a wait longer than STALL_TICKS (a worker descheduled while holding
    a chunk) starts a backoff of BACKOFF_TASKS tasks."""
    t0 = atomics.ticks()
    wait_done(ctrl, n_chunks)
    if atomics.ticks() - t0 > STALL_TICKS:
        ctrl[BACKOFF] = BACKOFF_TASKS


@njit(**_STEP)
def next_chunk(ctrl):
    """A chunk claimed from the current job (retrying lost races), or -1 when none is left."""
    while True:
        c, w = claim(ctrl)
        if c != -2:
            return c


@njit(**_STEP)
def should_sleep(ctrl) -> bool:
    return atomics.load(ctrl, SLEEP) != 0


@njit(**_STEP)
def quantized_views(xq, dq, hq, n, n_in):
    """The shared quantized-activation buffers as X int16 [n, nb, 32], DX f32 [n, nb], QH int16 [n, nb, 2]
    (nb = 0 when n_in is not a multiple of 32: only float kernels take such widths)."""
    nb = n_in // QB if n_in % QB == 0 else 0
    return (xq[:n * nb * QB].reshape((n, nb, QB)), dq[:n * nb].reshape((n, nb)),
            hq[:n * nb * 2].reshape((n, nb, 2)))


@njit(SIGNATURES["task"], **JIT)
def no_task(args, chunk):
    """The task list of a pool without tasks (a typed list is never empty: one numba type for every pool)."""


def _no_pool() -> tuple:
    """The kernel arguments of an inactive pool."""
    return (np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int16), np.zeros(0, np.float32),
            np.zeros(0, np.int16), np.zeros(0, np.float32))


NO_POOL = _no_pool()


def enabled() -> bool:
    """Whether worker pools can run here (they need the JIT: the atomics are intrinsics)."""
    return not numba.config.DISABLE_JIT


class DecodePool:
    """Worker threads and shared buffers for the products of one model's one-token steps.

    groups: every product group (3 uniform matrices, kernels.decode.block.uniform) a step may publish,
    indexed by group id. max_in / max_out bound one token's activation width and a group's
    output width. serve: the workers' jitted loop, serve(ctrl, groups, tasks, layers, xf, xq, dq, hq,
    y, idle_ticks, idle_spins) (kernels.decode.layer.serve). tasks: functions compiled for
    SIGNATURES["task"] a step may publish, indexed by task id. layers: the model's dense layers' typed
    list (kernels.decode.layer's arguments, one list shared by every dense layer), with which the workers also
    take the attention of a batch's sequences (ROWS_JOB); None: they do not. read_ahead: the bytes of upcoming
    groups' weights an idle worker prefetches (0: none).
    """

    def __init__(self, groups: list[tuple], max_in: int, max_out: int, serve: Callable, tasks: tuple = (),
                 layers: Any = None, read_ahead: int = READ_AHEAD_BYTES):
        if not groups or len(groups) >= MAX_GROUPS:
            raise ValueError(f"a pool takes 1..{MAX_GROUPS - 1} product groups")
        if len(tasks) >= MAX_TASKS:
            raise ValueError(f"a pool takes at most {MAX_TASKS - 1} tasks")
        self.groups = typed_list(groups)
        self.tasks = typed_list([(fn,) for fn in tasks] or [(no_task,)])  # never empty: one numba type
        self.layers = layers  # the dense layers' typed list (kernels.decode.layer), or None: no ROWS_JOB
        nb = -(-max_in // QB)
        self.ctrl = np.zeros(CTRL_SIZE, np.int64)
        self.ctrl[SLEEP] = 1
        self.ctrl[ROWS] = int(layers is not None)
        self.ctrl[READ_AHEAD] = read_ahead // 64
        self._buffers = (np.zeros(max_in, np.float32), np.zeros(nb * QB, np.int16), np.zeros(nb, np.float32),
                         np.zeros(nb * 2, np.int16), np.zeros(max_out, np.float32))
        self._serve = serve
        self._lock = threading.Lock()
        self._workers: list[threading.Event] = []
        self.threads: list[threading.Thread] = []  # the worker threads started so far
        self._quit = [False]
        weakref.finalize(self, _stop_workers, self.ctrl, self._quit, self._workers)

    @property
    def worker_chunks(self) -> int:
        """Chunks the workers have computed so far (all steps)."""
        return int(self.ctrl[WORKER_CHUNKS])

    @property
    def worker_task_chunks(self) -> int:
        """Chunks of tasks the workers have computed so far (all steps)."""
        return int(self.ctrl[WORKER_TASK_CHUNKS])

    @property
    def kernel_args(self) -> tuple:
        """(ctrl, xf, xq, dq, hq, y): what a kernel needs to publish jobs (active while running)."""
        return (self.ctrl, *self._buffers)

    def _start_worker(self) -> None:
        wake = threading.Event()
        args = (self.ctrl, self.groups, self.tasks, self.layers, *self._buffers, IDLE_TICKS, IDLE_SPINS)
        t = threading.Thread(target=_worker_loop, args=(wake, self._quit, self._serve, args),
                             name=f"archrun-decode-{len(self._workers) + 1}", daemon=True)
        t.start()
        self._workers.append(wake)
        self.threads.append(t)

    def warm_up(self) -> None:
        """Compile (or load) the workers' loop: it returns at once while the pool sleeps."""
        self._serve(self.ctrl, self.groups, self.tasks, self.layers, *self._buffers, 1, 1)

    def wake(self, workers: int) -> None:
        """Start the first `workers` workers spinning (they sleep again after IDLE_TICKS without a job)."""
        self.ctrl[SLEEP] = 0  # an aligned 8-byte store: the workers see it whole
        for wake in self._workers[:workers]:
            wake.set()

    def rest(self) -> None:
        """Send spinning workers to sleep now (they also do after IDLE_TICKS without a job)."""
        self.ctrl[SLEEP] = 1

    @contextmanager
    def running(self, threads: int) -> Iterator[tuple]:
        """Kernel arguments for one step on `threads` threads (the caller's + threads - 1 workers);
        NO_POOL when threads < 2 or another thread is running a step with this pool."""
        if threads < 2 or not self._lock.acquire(blocking=False):
            yield NO_POOL
            return
        try:
            while len(self._workers) < threads - 1:
                self._start_worker()
            self.ctrl[THREADS] = threads
            self.wake(threads - 1)
            yield self.kernel_args
        finally:
            self.ctrl[THREADS] = 0  # the workers keep spinning a while: the next step may come soon
            self._lock.release()


def _worker_loop(wake: threading.Event, quit_flag: list, serve: Callable, args: tuple) -> None:
    """A worker thread: sleep until a step starts, then serve its jobs until told to sleep."""
    while True:
        wake.wait()
        wake.clear()
        if quit_flag[0]:
            return
        serve(*args)


def _stop_workers(ctrl: np.ndarray, quit_flag: list, workers: list[threading.Event]) -> None:
    ctrl[SLEEP] = 1
    quit_flag[0] = True
    for wake in workers:
        wake.set()
