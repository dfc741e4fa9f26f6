"""Classify a rank's main-thread stack into a phase, with the operation and the telling frames."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..frames import bare_name, is_stdlib, is_user
from ..snapshot import Frame, KernelState, Phase, ThreadStack
from ..record import Record
from .kernel import CALL_WORDS

COLLECTIVE_OPS = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "_allgather_base", "all_gather_object",
    "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast", "broadcast_object_list",
    "barrier", "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv", "all_to_all",
    "all_to_all_single", "reduce", "gather", "gather_object", "scatter", "scatter_object_list",
    "all_reduce_coalesced", "all_gather_coalesced", "wait_tensor", "_store_based_barrier",
})
INIT_FUNCTIONS = frozenset({
    "init_process_group", "new_group", "_new_process_group_helper", "rendezvous", "_create_c10d_store",
    "_env_rendezvous_handler", "_tcp_rendezvous_handler", "next_rendezvous", "init_device_mesh",
})
# Native (C++) names that reveal a collective when Python frames cannot, e.g. DDP's reducer.
NATIVE_COLLECTIVE = re.compile(r"c10d::|ProcessGroup(NCCL|Gloo)|gloo::|ncclKernel|nccl[A-Z]")
NATIVE_DDP = re.compile(r"c10d::Reducer::")
# Native names of the host blocking on its GPU, most telling first: (pattern, op shown).
NATIVE_GPU_WAIT: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), op) for p, op in (
    (r"_local_scalar_dense_cuda", "item()"),
    (r"cuMemcpyDtoH|cudaMemcpy(?!Async)|cuMemcpy(?!Async)", "copy to host"),
    (r"cuEventSynchronize|cudaEventSynchronize", "event synchronize"),
    (r"cuStreamSynchronize|cudaStreamSynchronize", "stream synchronize"),
    (r"cuCtxSynchronize|cudaDeviceSynchronize|device_synchronize", "device synchronize"),
    # A launch waits (spinning in sched_yield) while the GPU's queue is full behind unfinished work:
    # how an NCCL rank whose host ran ahead of a hung collective ends up (tests/fixtures/h200).
    (r"cuLaunchKernel|cudaLaunchKernel", "kernel launch"),
))
# Python frames of a host waiting on its GPU: (path part, function names). A torch Future's wait()
# is the host waiting for asynchronous work to finish: on GPU jobs, CUDA/NCCL work behind it; on
# CPU, the stand-in for a long GPU step (tui/planted.py longstep).
PYTHON_GPU_WAIT = (("torch/cuda/", frozenset({"synchronize"})), ("torch/accelerator/", frozenset({"synchronize"})),
                   ("torch/futures/", frozenset({"wait"})))
# Layers that only pass a call through: `where` skips them to land on the caller's line. Anchored on
# the package directory, so a venv under /opt/torch/ does not make every frame plumbing.
PLUMBING = re.compile(
    r"(?:(?:site|dist)-packages/|^|/)(?:torch|accelerate|deepspeed/comm|deepspeed/utils|torch_xla|apex|"
    r"megatron/core/parallel_state|functorch|_pytest)/(?!\.)"
)
_SOURCE_TORCH = re.compile(r"/torch/(?:distributed|nn|autograd|utils|cuda|optim|_tensor\.py|_dynamo|amp)")
# multiprocessing's Pool and its results: a wait in them is a wait for the pool's worker processes.
POOL_CLASSES = frozenset({"Pool", "ApplyResult", "MapResult", "IMapIterator", "IMapUnorderedIterator"})
# subprocess.py's waits for a child (run, call, check_output, communicate, wait).
SUBPROCESS_WAITS = frozenset({"wait", "_wait", "_try_wait", "communicate", "_communicate", "run", "call",
                              "check_call", "check_output"})
# Native frames of the interpreter's own call machinery (ctypes, libffi, pybind11, CPython): the C
# function a Python line called is the first native frame past them.
_INTERPRETER_FILES = re.compile(r"libpython|/python3?\.\d+$|_ctypes|libffi|/Modules/|/Objects/|/Python/|pybind11")
_INTERPRETER_FUNCS = ("0x", "Py", "_Py", "pybind11::", "ffi_", "cfunction_", "method_vectorcall", "_call_function")
# A lock taken by ``with``, whatever its name (``metrics_lock``, ``self._cv``, ``threading.Lock()``,
# ``sem``), or by ``.acquire(`` or ``.wait(`` (``\b…_lock\b`` missed ``with metrics_lock:``).
LOCK_LINE = re.compile(r"\bwith\b[^#]*(lock|mutex|cond|(?<![a-z])cv\b|sema|(?<![a-z])sem\b)|\.acquire\(|\.wait\(", re.I)
SLEEP_LINE = re.compile(r"\bsleep\(")


SourceLine = Callable[[Frame], str]


@dataclass(frozen=True, repr=False)
class Classification(Record):
    """What a rank's stack says: its phase, collective, place and user frame."""

    phase: Phase
    op: str | None
    where: str | None
    user_frame: str | None
    detail: str | None = None


# A library's decorator that only forwards the call (typing_extensions' ``deprecated``, wrapt,
# functools.wraps-style ``wrapper``): never a place of its own; the caller's line is.
_WRAPPER_NAMES = frozenset({"wrapper", "wrapped", "_wrapper", "inner", "_inner", "decorate_context", "decorated",
                            "new_func", "wrapper_function"})
_WRAPPER_FILES = re.compile(r"(?:site|dist)-packages/(?:typing_extensions\.py|wrapt/|decorator\.py|deprecated/)")


def is_plumbing(frame: Frame) -> bool:
    path = frame.file
    if _WRAPPER_FILES.search(path) or (not is_user(frame) and bare_name(frame.function) in _WRAPPER_NAMES):
        return True
    if "-packages/" in path:
        return bool(PLUMBING.search(path[path.index("-packages/") - 4:]))
    return bool(_SOURCE_TORCH.search(path)) or bool(PLUMBING.match(path.lstrip("/")))


def where_frame(frames: tuple[Frame, ...]) -> Frame | None:
    """Innermost Python frame outside the standard library and plumbing layers."""
    python = [f for f in frames if not f.native]
    for frame in python:
        if not is_stdlib(frame) and not is_plumbing(frame):
            return frame
    return python[0] if python else None


def main_thread(threads: tuple[ThreadStack, ...] | list[ThreadStack] | None) -> ThreadStack | None:
    """The thread that trains, the one judged: the main thread (py-spy's thread whose id is the
    PID), unless it only waits for another thread (``join``, a queue, a future, Ray's task loop)
    while a thread runs the training: Ray Train's ``TrainingThread``, or a thread in torch or the
    user's code. Else the first listed."""
    if not threads:
        return None
    main = next((t for t in threads if t.is_main), threads[0])
    if not _only_waits_for_threads(main):
        return main
    others = [t for t in threads if t is not main and any(not f.native for f in t.frames)]
    named = next((t for t in others if t.name.startswith("TrainingThread")), None)
    if named is not None:
        return named
    training = [t for t in others if any("torch/" in f.file or is_user(f) for f in t.frames if not f.native)
                and not _only_waits_for_threads(t)]
    return training[0] if len(training) == 1 else main


# Where a main thread sits while another thread does the work: threading's joins and waits, a
# future's result, Ray's worker loop (an actor's tasks run on their own thread).
_THREAD_WAITS = (("threading.py", ("join", "_wait_for_tstate_lock", "wait")),
                 ("concurrent/futures/_base.py", ("result", "wait")),
                 ("ray/_private/worker.py", ("main_loop",)))


def _only_waits_for_threads(thread: ThreadStack) -> bool:
    python = [f for f in thread.frames if not f.native]
    if not python or any(is_exiting(f) for f in python):
        return False  # interpreter shutdown waiting for threads is "exiting", judged as such
    if pool_call(python) is not None:
        return False  # a Pool's result: its worker processes owe it, not a thread of this process
    inner = python[0]
    # Ray's worker loop runs an actor's tasks: a synchronous actor's method runs on this very
    # thread (a worker group of plain Ray actors trains there), Ray Train's hands its loop to a thread.
    in_ray_loop = any(f.file.endswith("ray/_private/worker.py") and bare_name(f.function) == "main_loop"
                      for f in python)
    return any(inner.file.endswith(path) and bare_name(inner.function) in names for path, names in _THREAD_WAITS) \
        or (in_ray_loop and not any(is_user(f) for f in python))


def classify(threads: list[ThreadStack] | tuple[ThreadStack, ...],
             source_line: SourceLine | None = None, kernel: KernelState | None = None) -> Classification:
    """Phase of the main thread, its op, the telling frame, and the user's frame. ``source_line``:
    the text of a frame's line (``read/stacks/source_lines.py``), which tells a sleep or a lock wait in
    plain Python; without it such a frame counts as compute. ``kernel``: the kernel's view of the
    main thread when sampled, which tells a wait for a child process or a blocked read or write
    (a file, FIFO, pipe or socket) that the Python line alone cannot."""
    main = main_thread(threads)
    if main is None or not main.frames:
        return Classification("unknown", None, None, None, "no Python stack (not a Python process, or exiting)")
    frames = main.frames
    where = where_frame(frames)
    user = next((f for f in frames if is_user(f)), None)
    phase, op = _phase_of(main, source_line or _no_source, kernel if main.is_main else None)
    detail = _explain(phase, main, threads)
    return Classification(phase, op, where.label() if where else None, user.label() if user else None, detail)


def _phase_of(main: ThreadStack, source_line: SourceLine,
              kernel: KernelState | None = None) -> tuple[Phase, str | None]:
    python = [f for f in main.frames if not f.native]
    if any(f.native and f.function.startswith(FINALIZE_SYMBOLS) for f in main.frames):
        return "exiting", "shutdown"
    for frame in python:  # innermost first: the deepest known call decides
        path, func = frame.file, bare_name(frame.function)
        if is_exiting(frame):
            return "exiting", "shutdown"
        if any(part in path and func in names for part, names in PYTHON_GPU_WAIT):
            return "gpu_wait", _native_gpu_op(main.frames) or ("Future.wait" if "torch/futures/" in path else func)
        if "torch/distributed/" in path and func in INIT_FUNCTIONS or "/rendezvous" in path:
            return "init", func
        if func in COLLECTIVE_OPS and ("torch/distributed/" in path or "deepspeed/comm/" in path):
            return "collective", _canonical_op(func)
        if func == "wrapper" and path.endswith("torch/distributed/c10d_logger.py"):
            # torch's decorator around every c10d call: inside it, the rank is in that call (here in
            # its error path: the collective failed, e.g. as a peer died, and is being logged).
            return "collective", _called_op(python, frame, source_line)
        if "torch/utils/data/" in path and ("dataloader" in path or "_utils/" in path):
            return "dataloader", "next batch"
        if path.endswith("torch/serialization.py") or "safetensors/" in path or "distributed/checkpoint/" in path:
            return "checkpoint", func
    native = [f.function for f in main.frames if f.native]
    if any(NATIVE_DDP.search(name) for name in native):
        return "collective", "all_reduce (DDP gradients)"
    collective = next((name for name in native if NATIVE_COLLECTIVE.search(name)), None)
    if collective is not None:
        return "collective", _native_op(collective)
    gpu_op = _native_gpu_op(main.frames)
    if gpu_op is not None:
        return "gpu_wait", gpu_op
    for frame in python:  # known heavy lifting: the thread may wait on C++ workers, it is still compute
        op = _compute_op(frame)
        if op:
            return "compute", op
    innermost = python[0] if python else None
    if innermost is None:
        return ("compute" if main.active else "unknown"), None
    pool = pool_call(python)
    if pool is not None:  # multiprocessing's Pool: its answer is owed by a worker process
        return "subprocess", pool
    if _in_subprocess(python) or (kernel is not None and kernel.target_kind == "child"):
        return "subprocess", None
    if innermost.file.endswith(("threading.py", "queue.py")) or "concurrent/futures" in innermost.file:
        return "lock", _waited_call(python)
    if main.active is False and kernel is not None and kernel.letter in ("S", "D") \
            and kernel.target_kind in ("file", "fifo", "pipe", "socket"):
        return "io", CALL_WORDS.get(kernel.syscall or "", kernel.syscall)
    if main.owns_gil and main.active is False:  # idle holding the GIL: inside a C call that never let it go
        callee = native_callee(main.frames)
        return "native", callee.split(" in ", 1)[0] if callee else None
    line = source_line(innermost) if innermost.line else ""
    if SLEEP_LINE.search(line):
        return "sleep", "sleep"
    if main.active is False and LOCK_LINE.search(line):
        return "lock", "acquire"
    return ("compute" if main.active is not False else "unknown"), None


def _waited_call(python: list[Frame]) -> str:
    """The call the caller made into threading, queue or concurrent.futures (``Event.wait``,
    ``Queue.get``, ``Future.result``): the outermost of their frames above the caller's own."""
    call = python[0].function
    for frame in python:
        if frame.file.endswith(("threading.py", "queue.py")) or "concurrent/futures" in frame.file:
            call = frame.function
        else:
            break
    return call


def pool_call(python: list[Frame]) -> str | None:
    """``Pool.map`` when the innermost frames (the standard library's, up to the caller's own) wait
    in ``multiprocessing/pool.py``: the pool call the caller made (its outermost frame there)."""
    call = None
    for frame in python:
        if frame.file.endswith("multiprocessing/pool.py"):
            call = frame.function
        elif not is_stdlib(frame):
            break
    return call


def is_pool_op(op: str | None) -> bool:
    """The op of a rank waiting for a ``multiprocessing`` Pool (``pool_call``)."""
    return bool(op) and op.split(".", 1)[0] in POOL_CLASSES


def _in_subprocess(python: list[Frame]) -> bool:
    """The innermost frames (the standard library's, up to the caller's own) wait in subprocess.py."""
    for frame in python:
        if frame.file.endswith("/subprocess.py") and bare_name(frame.function) in SUBPROCESS_WAITS:
            return True
        if not is_stdlib(frame):
            return False
    return False


def native_callee(frames: tuple[Frame, ...]) -> str | None:
    """``sleep() in libc.so.6``: the C function the innermost Python frame called, from a native
    sample (the first native frame past ctypes', libffi's, pybind11's and CPython's own); None
    without native frames."""
    first_python = next((i for i, f in enumerate(frames) if not f.native), len(frames))
    for frame in reversed(frames[:first_python]):  # from the Python frame inwards
        if frame.function.startswith(_INTERPRETER_FUNCS) or _INTERPRETER_FILES.search(frame.file):
            continue
        return f"{frame.function}() in {frame.file.rsplit('/', 1)[-1]}"
    return None


_CALL = re.compile(r"\.(\w+)\(")


def _called_op(python: list[Frame], wrapper: Frame, source_line: SourceLine) -> str:
    """The c10d call a ``c10d_logger`` wrapper wraps: a c10d collective further out (torch calls one
    from another: ``all_gather_into_tensor`` wraps ``all_gather_single``), else read from the first
    caller's line outside torch's and its decorators' frames (``dist.all_reduce(x)``)."""
    outer = python[python.index(wrapper) + 1:]
    for frame in outer:
        func = bare_name(frame.function)
        if "torch/distributed/" in frame.file and func in COLLECTIVE_OPS:
            return _canonical_op(func)
        if not (PLUMBING.search(frame.file) or func == "wrapper" or is_stdlib(frame)
                or frame.file.endswith("typing_extensions.py")):
            line = source_line(frame) if frame.line else ""
            called = [name for name in _CALL.findall(line) if name in COLLECTIVE_OPS]
            return _canonical_op(called[-1]) if called else "collective"
    return "collective"


def _compute_op(frame: Frame) -> str | None:
    path, func = frame.file, bare_name(frame.function)
    if func == "backward" and ("torch/autograd/" in path or path.endswith("torch/_tensor.py")):
        return "backward"
    if "torch/optim/" in path:
        return "optimizer step"
    if "torch/nn/modules/" in path and func in ("_call_impl", "_wrapped_call_impl", "forward"):
        return "forward"
    return None


def _native_gpu_op(frames: tuple[Frame, ...]) -> str | None:
    """What the host waits on its GPU for, from native frames (None: no such frame)."""
    names = [f.function for f in frames if f.native]
    for pattern, op in NATIVE_GPU_WAIT:
        if any(pattern.search(name) for name in names):
            return op
    return None


def _canonical_op(func: str) -> str:
    return {"_store_based_barrier": "barrier"}.get(func, func)


def _native_op(symbol: str) -> str:
    match = re.search(r"(allreduce|allgather|reduce_scatter|broadcast|barrier|alltoall|send|recv)", symbol, re.I)
    if match:
        return match.group(1).lower()
    return "Work.wait (async collective)" if "Work::wait" in symbol or "Work::synchronize" in symbol else "collective"


def _no_source(frame: Frame) -> str:
    return ""


def _explain(phase: Phase, main: ThreadStack, threads) -> str | None:
    """For a blocked main thread, point at other threads that are doing something."""
    if phase == "exiting":
        return lingering_detail(main, threads)
    if phase != "unknown":  # a lock's candidates are in what the rank waits for (judge/waits.py)
        return None
    others = []
    for thread in threads:
        if thread is main or not thread.frames:
            continue
        frame = where_frame(thread.frames)
        if frame is not None and is_user(frame):
            others.append(f"thread {thread.name!r} at {frame.label()}")
    if not others:
        return None
    prefix = "other threads in user code (may hold what the main thread waits for): "
    return prefix + "; ".join(others[:3])


def stack_signature(stack: ThreadStack | None) -> tuple:
    """Identity of a stack for change detection: every Python frame with its line."""
    if stack is None:
        return ()
    return tuple((f.file, f.function, f.line) for f in stack.frames if not f.native)


# Interpreter shutdown: the main thread has finished (or raised) and Python waits for threads or
# runs exit handlers. The process lingers only while a non-daemon thread (or a handler) runs.
FINALIZE_SYMBOLS = ("Py_FinalizeEx", "Py_Finalize", "_Py_Finalize", "wait_for_thread_shutdown")
EXIT_FUNCTIONS = {("threading.py", "_shutdown"), ("atexit.py", "_run_exitfuncs"), ("", "_exithandlers"),
                  ("thread.py", "_python_exit"), ("util.py", "_exit_function")}


def is_exiting(frame: Frame) -> bool:
    """A frame of interpreter shutdown: ``threading._shutdown``, atexit's handlers."""
    name = frame.file.replace("\\", "/").rsplit("/", 1)[-1]
    func = frame.function.rsplit(".", 1)[-1]
    return (name, func) in EXIT_FUNCTIONS or ("", func) in EXIT_FUNCTIONS


def lingering_detail(main: ThreadStack, threads) -> str:
    """Which threads keep an exiting rank alive. py-spy cannot tell daemon threads apart, so every
    other thread running Python code is named (a daemon one among them is shown too)."""
    others = []
    for thread in threads:
        if thread is main or not any(not f.native for f in thread.frames) or thread.name.startswith("trainwatch"):
            continue
        frame = where_frame(thread.frames)
        others.append(f"{thread.name!r}" + (f" at {frame.label()}" if frame else ""))
    if not others:
        return "main thread exited; the interpreter is shutting down"
    noun = "non-daemon thread" if len(others) == 1 else "a non-daemon thread among"
    return f"main thread exited; kept alive by {noun} " + ", ".join(others[:4])
