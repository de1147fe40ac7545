"""A catalogue of the ways PyTorch code keeps tensor memory alive, each reduced from a public bug
report and set beside the fix from the same thread.

Each entry is a pair of test files as a user would write them: ``leak`` keeps a little more memory on
every run of its test, ``fixed`` does the same work the way the thread fixed it. ``holder`` is an
fnmatch pattern one of the ``held by`` lines of the group holding most bytes must match (it names the
mechanism's object), the line marked ``# here`` in ``leak`` is where that group's storage is allocated,
and ``diagnosis`` are words (case-insensitive) its diagnosis must contain: the mechanism and its fix.
``GAPS`` names, for each entry, the parts the plugin does not get right yet, with what it says today.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Literal

Part = Literal["caught", "fixed", "holder", "site", "diagnosis"]


@dataclass(frozen=True)
class Mechanism:
    name: str
    kind: str
    source: str
    leak: str
    fixed: str
    holder: str
    diagnosis: tuple[str, ...]

    @property
    def gaps(self) -> dict[Part, str]:
        return GAPS.get(self.name, {})

    @property
    def leak_file(self) -> str:
        return "import pytest, torch\n" + textwrap.dedent(self.leak)

    @property
    def fixed_file(self) -> str:
        return "import pytest, torch\n" + textwrap.dedent(self.fixed)

    @property
    def site(self) -> str:
        """The ``allocated at`` pattern for the line marked ``# here`` in the leaking file."""
        lines = self.leak_file.splitlines()
        marked = [number for number, line in enumerate(lines, 1) if line.rstrip().endswith("# here")]
        assert len(marked) == 1, f"{self.name}: mark exactly one line '# here'"
        return f"test_leak.py:{marked[0]} in *"


# The kinds issue reports group these mechanisms under; every kind has at least one entry.
KINDS = (
    "threads",
    "atexit",
    "weakref.finalize",
    "saved-tensor hooks and checkpoint",
    "autocast cache",
    "torch.compile caches",
    "class attributes",
    "caching iterators",
    "memoizing and lru_cache",
    "hooks",
    "registries of prepared objects",
    "logging and warnings",
    "autograd graphs kept",
    "views and storages",
    "tracebacks",
    "optimizer state",
    "metrics and meters",
    "asyncio tasks",
    "context variables",
    "dict keys and weak-key dictionaries",
    "frames kept",
    "executors",
    "garbage collector settings",
    "signal handlers",
    "callbacks waiting to run",
    "torch modes",
    "modules made at run time",
    "outputs kept with their caches",
)

_MEMOIZED_DATASET = """
        class SafeDataset(torch.utils.data.Dataset):
            def __len__(self):
                return 1_000_000

            @memoize
            def __getitem__(self, index):
                return torch.full((2048,), float(index))  # here

        DATASET = SafeDataset()
        INDEX = itertools.count()

        def test_it():
            assert DATASET[next(INDEX)].numel() == 2048
        """
"""A dataset whose items ``memoize`` (defined before it) caches: the two memoizing entries' leak."""
_DATASET_NOT_MEMOIZED = """
        import itertools

        class SafeDataset(torch.utils.data.Dataset):
            def __len__(self):
                return 1_000_000

            def __getitem__(self, index):
                return torch.full((2048,), float(index))

        DATASET = SafeDataset()
        INDEX = itertools.count()

        def test_it():
            assert DATASET[next(INDEX)].numel() == 2048
        """
"""The thread's fix: no memo."""

_METRIC_OF_A_FIXTURE = """
        class BinaryAUROC:
            def __init__(self):
                self.preds = []

            def update(self, preds):
                self.preds.append(preds)

            def compute(self):
                return torch.cat(self.preds).mean()

            def reset(self):
                self.preds.clear()

        @pytest.fixture(scope="module")
        def val_metric():
            return BinaryAUROC()
        """
"""A metric with list states, which a module-scoped fixture shares between tests."""

CATALOGUE: list[Mechanism] = [
    # pytorch/pytorch#83595 (the DataLoader's pin-memory loop kept the last batch as a frame local
    # between iterations) and pytorch/pytorch#64412 (tensors made in loader threads pile up)
    Mechanism(
        name="thread_frame_local",
        kind="threads",
        source="pytorch/pytorch#83595",
        leak="""
        import queue, threading

        def pin_memory_loop(in_queue, out_queue):
            while True:
                index = in_queue.get()
                if index is None:
                    return
                data = torch.ones(2048) * index  # here
                out_queue.put((index, data))

        def test_it():
            in_queue, out_queue = queue.Queue(), queue.Queue()
            thread = threading.Thread(target=pin_memory_loop, args=(in_queue, out_queue), name="pin_memory", daemon=True)
            thread.start()
            in_queue.put(1)
            index, batch = out_queue.get()
            assert batch.sum() == 2048
        """,
        fixed="""
        import queue, threading

        def pin_memory_loop(in_queue, out_queue):
            while True:
                index = in_queue.get()
                if index is None:
                    return
                data = torch.ones(2048) * index
                out_queue.put((index, data))

        def test_it():
            in_queue, out_queue = queue.Queue(), queue.Queue()
            thread = threading.Thread(target=pin_memory_loop, args=(in_queue, out_queue), name="pin_memory", daemon=True)
            thread.start()
            in_queue.put(1)
            index, batch = out_queue.get()
            assert batch.sum() == 2048
            in_queue.put(None)
            thread.join()
        """,
        holder="*thread 'pin_memory'*local 'data'*",
        diagnosis=("thread", "join"),
    ),
    # libffcv/ffcv#345 (each iterator's prefetch thread lives on until close() and join()); the test
    # waits for the queue to fill, so the thread's allocations fall inside the test's run
    Mechanism(
        name="prefetch_thread_blocked_on_a_full_queue",
        kind="threads",
        source="libffcv/ffcv#345",
        leak="""
        import queue, threading, time

        class Prefetcher:
            def __init__(self, steps):
                self.batches = queue.Queue(maxsize=2)
                self.thread = threading.Thread(target=self.fill, args=(steps,), name="prefetch", daemon=True)
                self.thread.start()

            def fill(self, steps):
                for step in range(steps):
                    self.batches.put(torch.full((2048,), float(step)))  # here

            def __next__(self):
                return self.batches.get()

        def test_it():
            loader = Prefetcher(steps=100)
            assert next(loader).sum() == 0
            while not loader.batches.full():
                time.sleep(0.001)
        """,
        fixed="""
        import queue, threading, time

        class Prefetcher:
            def __init__(self, steps):
                self.batches = queue.Queue(maxsize=2)
                self.stop = threading.Event()
                self.thread = threading.Thread(target=self.fill, args=(steps,), name="prefetch", daemon=True)
                self.thread.start()

            def fill(self, steps):
                for step in range(steps):
                    while not self.stop.is_set():
                        try:
                            self.batches.put(torch.full((2048,), float(step)), timeout=0.01)
                            break
                        except queue.Full:
                            continue
                    if self.stop.is_set():
                        return

            def __next__(self):
                return self.batches.get()

            def close(self):
                self.stop.set()
                self.thread.join()
                while not self.batches.empty():
                    self.batches.get()

        def test_it():
            loader = Prefetcher(steps=100)
            assert next(loader).sum() == 0
            while not loader.batches.full():
                time.sleep(0.001)
            loader.close()
        """,
        holder="*thread 'prefetch'*",
        diagnosis=("thread", "join"),
    ),
    # pytorch/pytorch#86136 (a thread-local cache is only cleared in the thread that clears it)
    Mechanism(
        name="threading_local_cache",
        kind="threads",
        source="pytorch/pytorch#86136",
        leak="""
        import itertools, threading

        _LOCAL = threading.local()
        STEP = itertools.count()

        def cached_mask(step):
            cache = getattr(_LOCAL, "masks", None)
            if cache is None:
                cache = _LOCAL.masks = {}
            if step not in cache:
                cache[step] = torch.ones(2048)  # here
            return cache[step]

        def test_it():
            assert cached_mask(next(STEP)).sum() == 2048
        """,
        fixed="""
        import itertools, threading

        _LOCAL = threading.local()
        STEP = itertools.count()

        def cached_mask(step):
            cache = getattr(_LOCAL, "masks", None)
            if cache is None:
                cache = _LOCAL.masks = {}
            if step not in cache:
                cache[step] = torch.ones(2048)
            return cache[step]

        def test_it():
            assert cached_mask(next(STEP)).sum() == 2048
            _LOCAL.masks.clear()
        """,
        holder="*_LOCAL.masks[[]*",
        diagnosis=("threading.local", "clear"),
    ),
    # ponty/EasyProcess#1 (a shutdown closure registered with atexit on every start is kept, with what
    # it closes over, until the process exits) and wandb/wandb#354 (logged tensors kept, .item() fixed it)
    Mechanism(
        name="atexit_closure",
        kind="atexit",
        source="ponty/EasyProcess#1",
        leak="""
        import atexit

        def log_at_exit(name, value):
            atexit.register(lambda: print(name, float(value.sum())))

        def test_it():
            activations = torch.ones(2048)  # here
            log_at_exit("activations", activations)
        """,
        fixed="""
        import atexit

        def log_at_exit(name, value):
            number = float(value.sum())
            atexit.register(lambda: print(name, number))

        def test_it():
            activations = torch.ones(2048)
            log_at_exit("activations", activations)
        """,
        holder="*atexit*closure var 'value'*",
        diagnosis=("atexit", "unregister"),
    ),
    # datalab-to/marker#419 (atexit.register(self.cleanup_pdf_doc) per document), ARM-software/devlib#676
    # and jupyter/jupyter_client#264: an object that registers its own bound method with atexit lives,
    # with everything it buffers, until exit; unregister it (or register a function) to let it go
    Mechanism(
        name="atexit_bound_method",
        kind="atexit",
        source="datalab-to/marker#419",
        leak="""
        import atexit

        class MetricsWriter:
            def __init__(self):
                self.pending = []
                atexit.register(self.flush)

            def add(self, value):
                self.pending.append(value)

            def flush(self):
                self.pending.clear()

        def test_it():
            writer = MetricsWriter()
            writer.add(torch.ones(2048))  # here
        """,
        fixed="""
        import atexit

        class MetricsWriter:
            def __init__(self):
                self.pending = []
                atexit.register(self.flush)

            def add(self, value):
                self.pending.append(value)

            def flush(self):
                self.pending.clear()

            def close(self):
                self.flush()
                atexit.unregister(self.flush)

        def test_it():
            writer = MetricsWriter()
            writer.add(torch.ones(2048))
            writer.close()
        """,
        holder="*atexit*pending[[]*",
        diagnosis=("atexit", "unregister"),
    ),
    # DiamondLightSource/httomo#265 (weakref.finalize(obj, obj.method): the bound method keeps obj
    # alive, so the finalizer never runs and obj is never freed)
    Mechanism(
        name="weakref_finalize_bound_method",
        kind="weakref.finalize",
        source="DiamondLightSource/httomo#265",
        leak="""
        import weakref

        class StagingBuffer:
            def __init__(self):
                self.buffer = torch.empty(2048)  # here
                self._finalizer = weakref.finalize(self, self.release)

            def release(self):
                self.buffer = None

        def test_it():
            staging = StagingBuffer()
            staging.buffer.fill_(1.0)
        """,
        fixed="""
        import weakref

        class StagingBuffer:
            def __init__(self):
                self.buffer = torch.empty(2048)
                self._finalizer = weakref.finalize(self, StagingBuffer.release_buffer, self.__dict__)

            @staticmethod
            def release_buffer(state):
                state["buffer"] = None

        def test_it():
            staging = StagingBuffer()
            staging.buffer.fill_(1.0)
        """,
        holder="*finalize*buffer*",
        diagnosis=("weakref.finalize", "bound method"),
    ),
    # bluesky/ophyd#865 (finalizers that close over self keep self alive until exit)
    Mechanism(
        name="weakref_finalize_closure_over_self",
        kind="weakref.finalize",
        source="bluesky/ophyd#865",
        leak="""
        import weakref

        class FeatureCache:
            def __init__(self):
                self.features = [torch.ones(2048)]  # here
                weakref.finalize(self, lambda: self.features.clear())

        def test_it():
            cache = FeatureCache()
            assert len(cache.features) == 1
        """,
        fixed="""
        import weakref

        class FeatureCache:
            def __init__(self):
                self.features = [torch.ones(2048)]
                features = self.features
                weakref.finalize(self, features.clear)

        def test_it():
            cache = FeatureCache()
            assert len(cache.features) == 1
        """,
        holder="*finalize*closure var 'self'*features*",
        diagnosis=("weakref.finalize", "self"),
    ),
    # pytorch/pytorch#82482 (a saved-tensors pack hook keeps what autograd packs; what is packed but
    # never unpacked, because no backward runs, stays in its storage)
    Mechanism(
        name="saved_tensors_pack_hook_storage",
        kind="saved-tensor hooks and checkpoint",
        source="pytorch/pytorch#82482",
        leak="""
        MODEL = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh())

        class Offload:
            def __init__(self):
                self.storage = {}

            def pack(self, tensor):
                key = len(self.storage)
                self.storage[key] = tensor.to("cpu", copy=True)  # here
                return key

            def unpack(self, key):
                return self.storage.pop(key)

        OFFLOAD = Offload()

        def test_it():
            batch = torch.ones(32, 64, requires_grad=True)
            with torch.autograd.graph.saved_tensors_hooks(OFFLOAD.pack, OFFLOAD.unpack):
                out = MODEL(batch)
            assert out.shape == (32, 64)
        """,
        fixed="""
        MODEL = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh())

        class Offload:
            def __init__(self):
                self.storage = {}

            def pack(self, tensor):
                key = len(self.storage)
                self.storage[key] = tensor.to("cpu", copy=True)
                return key

            def unpack(self, key):
                return self.storage.pop(key)

        OFFLOAD = Offload()

        def test_it():
            batch = torch.ones(32, 64, requires_grad=True)
            with torch.no_grad(), torch.autograd.graph.saved_tensors_hooks(OFFLOAD.pack, OFFLOAD.unpack):
                out = MODEL(batch)
            assert out.shape == (32, 64)
        """,
        holder="*OFFLOAD.storage[[]*",
        diagnosis=("saved_tensors_hooks", "backward"),
    ),
    # pytorch/pytorch#78752 (non-reentrant checkpoint's saved-tensor hooks kept every activation in
    # their storage); here the user keeps checkpointed outputs, never run backward, with their graphs
    Mechanism(
        name="checkpointed_outputs_kept_without_backward",
        kind="saved-tensor hooks and checkpoint",
        source="pytorch/pytorch#78752",
        leak="""
        from torch.utils.checkpoint import checkpoint

        BLOCK = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
        LOSSES = []

        def test_it():
            batch = torch.ones(64, 64, requires_grad=True)  # here
            out = checkpoint(BLOCK, batch, use_reentrant=False)
            LOSSES.append(out.pow(2).mean())
        """,
        fixed="""
        from torch.utils.checkpoint import checkpoint

        BLOCK = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
        LOSSES = []

        def test_it():
            batch = torch.ones(64, 64, requires_grad=True)
            out = checkpoint(BLOCK, batch, use_reentrant=False)
            LOSSES.append(out.pow(2).mean().item())
        """,
        holder="*LOSSES[[]*",
        diagnosis=("checkpoint", "backward"),
    ),
    # pytorch/pytorch#115255 (an identity saved_tensors_hooks pair inside a non-reentrant checkpoint,
    # used to switch checkpointing off for part of the block: a forward run without backward, as in an
    # evaluation outside torch.no_grad(), is never freed)
    Mechanism(
        name="saved_tensors_hooks_under_checkpoint",
        kind="saved-tensor hooks and checkpoint",
        source="pytorch/pytorch#115255",
        leak="""
        from torch.utils.checkpoint import checkpoint

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1 = torch.nn.Linear(16, 32)
                self.ln2 = torch.nn.Linear(32, 512)

            def inner(self, x):
                x = torch.relu(self.ln1(x))
                with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                    x = torch.relu(self.ln2(x))  # here
                return x

            def forward(self, x):
                return checkpoint(self.inner, x, use_reentrant=False)

        NET = Net()

        def test_it():
            score = NET(torch.ones(8, 16, requires_grad=True)).sum()
            assert score.item() >= 0
        """,
        fixed="""
        from torch.utils.checkpoint import checkpoint

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1 = torch.nn.Linear(16, 32)
                self.ln2 = torch.nn.Linear(32, 512)

            def inner(self, x):
                x = torch.relu(self.ln1(x))
                with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                    x = torch.relu(self.ln2(x))
                return x

            def forward(self, x):
                return checkpoint(self.inner, x, use_reentrant=False)

        NET = Net()

        def test_it():
            with torch.no_grad():
                score = NET(torch.ones(8, 16, requires_grad=True)).sum()
            assert score.item() >= 0
        """,
        holder="*own autograd graph*saved_tensors_hooks pair (unpack hook test_leak.Net.inner.<locals>.<lambda>)*",
        diagnosis=("saved_tensors_hooks", "cycle", "detach", "no_grad"),
    ),
    # pytorch/pytorch#94990 (a custom autograd.Function saves a view of its own output: the view keeps
    # the output as its base, the output's grad_fn keeps the view; fixed in Lightning-AI/lightning-thunder#1352
    # by saving the view detached)
    Mechanism(
        name="custom_function_saves_a_view_of_its_output",
        kind="autograd graphs kept",
        source="pytorch/pytorch#94990",
        leak="""
        class ScaleFlat(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                b = a * 2.0  # here
                ctx.save_for_backward(b.view(-1))
                return b

            @staticmethod
            def backward(ctx, grad):
                (flat,) = ctx.saved_tensors
                return grad * 2.0

        def test_it():
            out = ScaleFlat.apply(torch.randn(64, 64, requires_grad=True))
            assert out.shape == (64, 64)
        """,
        fixed="""
        class ScaleFlat(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                b = a * 2.0
                ctx.save_for_backward(b.view(-1).detach())
                return b

            @staticmethod
            def backward(ctx, grad):
                (flat,) = ctx.saved_tensors
                return grad * 2.0

        def test_it():
            out = ScaleFlat.apply(torch.randn(64, 64, requires_grad=True))
            assert out.shape == (64, 64)
        """,
        holder="*own autograd graph: autograd.Function test_leak.ScaleFlat saved a view of it for backward*",
        diagnosis=("view of its own output", "cycle", "detach"),
    ),
    # pytorch/pytorch#86136 and ecmwf/anemoi-core#134 (autocast caches the low-precision casts of
    # weights that require grad until the outermost autocast region exits; a region entered by a
    # helper and never exited keeps a cast, and through its grad_fn the weight, for every new model)
    Mechanism(
        name="autocast_cache_never_exited",
        kind="autocast cache",
        source="ecmwf/anemoi-core#134",
        leak="""
        import threading

        _AMP = threading.local()

        def enable_mixed_precision():
            region = torch.autocast("cpu", dtype=torch.bfloat16)
            region.__enter__()
            _AMP.region = region

        def test_it():
            enable_mixed_precision()
            model = torch.nn.Linear(64, 64)  # here
            model(torch.ones(8, 64))
        """,
        fixed="""
        def test_it():
            model = torch.nn.Linear(64, 64)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model(torch.ones(8, 64))
        """,
        holder="*autocast*",
        diagnosis=("autocast", "exit"),
    ),
    # pytorch/pytorch#86136 (the autocast cache is thread-local: a cache filled in another thread is
    # never cleared by the thread that clears it); a serving thread whose loop runs inside one
    # autocast region keeps a cast of every model it serves
    Mechanism(
        name="autocast_cache_of_a_serving_thread",
        kind="autocast cache",
        source="pytorch/pytorch#86136",
        leak="""
        import queue, threading

        REQUESTS, RESULTS = queue.Queue(), queue.Queue()

        @torch.autocast("cpu", dtype=torch.bfloat16)
        def serve_forever():
            while True:
                model, batch = REQUESTS.get()
                RESULTS.put(model(batch).float().sum().item())
                del model, batch

        threading.Thread(target=serve_forever, name="inference-server", daemon=True).start()

        def test_it():
            model = torch.nn.Linear(64, 64)  # here
            REQUESTS.put((model, torch.ones(8, 64)))
            assert RESULTS.get() is not None
        """,
        fixed="""
        import queue, threading

        REQUESTS, RESULTS = queue.Queue(), queue.Queue()

        def serve_forever():
            while True:
                model, batch = REQUESTS.get()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    RESULTS.put(model(batch).float().sum().item())
                del model, batch

        threading.Thread(target=serve_forever, name="inference-server", daemon=True).start()

        def test_it():
            model = torch.nn.Linear(64, 64)
            REQUESTS.put((model, torch.ones(8, 64)))
            assert RESULTS.get() is not None
        """,
        holder="*autocast*inference-server*",
        diagnosis=("autocast", "thread"),
    ),
    # pytorch/pytorch#43119 (also #35600 and #96726: a tensor a traced function reads from its closure
    # becomes a constant of the traced graph, which torch.jit keeps for the process; fixed by tracing
    # once, with the tensor as an argument)
    Mechanism(
        name="tensor_captured_by_a_traced_function",
        kind="torch.compile caches",
        source="pytorch/pytorch#43119",
        leak="""
        def make_projector(dim):
            basis = torch.randn(dim, dim)  # here

            def project(x):
                return x @ basis

            return torch.jit.trace(project, (torch.randn(4, dim),))

        def test_it():
            assert make_projector(64)(torch.randn(4, 64)).shape == (4, 64)
        """,
        fixed="""
        def _project(x, basis):
            return x @ basis

        TRACED = torch.jit.trace(_project, (torch.randn(4, 64), torch.randn(64, 64)))

        def test_it():
            assert TRACED(torch.randn(4, 64), torch.randn(64, 64)).shape == (4, 64)
        """,
        holder="*held from C++*",
        diagnosis=("trace once", "closure variable", "as an argument"),
    ),
    # pytorch/pytorch#105181 and #104095 (compiled models kept after the user is done with them; on
    # torch 2.13 dynamo's own cache no longer keeps a deleted module): a cache of compiled models, one
    # per batch-size bucket, that is never evicted
    Mechanism(
        name="cache_of_compiled_models",
        kind="torch.compile caches",
        source="pytorch/pytorch#105181",
        leak="""
        import itertools

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("scale", torch.ones(2048))  # here

            def forward(self, x):
                return x * self.scale

        _COMPILED = {}
        BUCKETS = itertools.count(1)

        def compiled_for(bucket):
            if bucket not in _COMPILED:
                _COMPILED[bucket] = torch.compile(Net(), backend="eager")
            return _COMPILED[bucket]

        def test_it():
            model = compiled_for(next(BUCKETS))
            assert model(torch.ones(2048)).sum() == 2048
        """,
        fixed="""
        import itertools

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("scale", torch.ones(2048))

            def forward(self, x):
                return x * self.scale

        NET = torch.compile(Net(), backend="eager", dynamic=True)
        BUCKETS = itertools.count(1)

        def test_it():
            next(BUCKETS)
            assert NET(torch.ones(2048)).sum() == 2048
        """,
        holder="*_COMPILED[[]*]._orig_mod.scale*",
        diagnosis=("torch.compile", "cache"),
    ),
    # PyCQA/flake8-bugbear#57 (a mutable class attribute leaks state from one instance to the next);
    # pytest makes a new instance for every test, so a class attribute outlives them all
    Mechanism(
        name="test_class_attribute",
        kind="class attributes",
        source="PyCQA/flake8-bugbear#57",
        leak="""
        class TestModel:
            outputs = []

            def test_it(self):
                self.outputs.append(torch.ones(2048))  # here
        """,
        fixed="""
        class TestModel:
            def setup_method(self):
                self.outputs = []

            def test_it(self):
                self.outputs.append(torch.ones(2048))
        """,
        holder="*TestModel.outputs[[]*",
        diagnosis=("class attribute", "instance"),
    ),
    # talmolab/sleap-nn#574 (a dict declared as a class attribute is shared by every instance and
    # grows without bound)
    Mechanism(
        name="class_attribute_shared_by_instances",
        kind="class attributes",
        source="talmolab/sleap-nn#574",
        leak="""
        import itertools

        TRACK_IDS = itertools.count()

        class Tracker:
            track_features = {}

            def track(self, features):
                self.track_features[next(TRACK_IDS)] = features

        def test_it():
            tracker = Tracker()
            tracker.track(torch.ones(2048))  # here
        """,
        fixed="""
        import itertools

        TRACK_IDS = itertools.count()

        class Tracker:
            def __init__(self):
                self.track_features = {}

            def track(self, features):
                self.track_features[next(TRACK_IDS)] = features

        def test_it():
            tracker = Tracker()
            tracker.track(torch.ones(2048))
        """,
        holder="*Tracker.track_features[[]*",
        diagnosis=("class attribute", "instance"),
    ),
    # pytorch/pytorch#23900 (itertools.cycle keeps a copy of every item of the first pass)
    Mechanism(
        name="itertools_cycle",
        kind="caching iterators",
        source="pytorch/pytorch#23900",
        leak="""
        import itertools

        class Batches(torch.utils.data.Dataset):
            def __len__(self):
                return 1000

            def __getitem__(self, index):
                return torch.full((2048,), float(index))  # here

        LOADER = torch.utils.data.DataLoader(Batches(), batch_size=None)
        BATCHES = itertools.cycle(LOADER)

        def test_it():
            assert next(BATCHES).numel() == 2048
        """,
        fixed="""
        class Batches(torch.utils.data.Dataset):
            def __len__(self):
                return 1000

            def __getitem__(self, index):
                return torch.full((2048,), float(index))

        def forever(loader):
            while True:
                yield from loader

        LOADER = torch.utils.data.DataLoader(Batches(), batch_size=None)
        BATCHES = forever(LOADER)

        def test_it():
            assert next(BATCHES).numel() == 2048
        """,
        holder="*BATCHES*",
        diagnosis=("itertools.cycle", "every"),
    ),
    # pytorch/pytorch#1917 and facebookresearch/detectron2#3847 (a loader's iterator kept across
    # steps holds what its dataset's generator has buffered); kept once, a 2 MiB shuffle buffer
    Mechanism(
        name="kept_dataloader_iterator",
        kind="caching iterators",
        source="pytorch/pytorch#1917",
        leak="""
        class Shuffled(torch.utils.data.IterableDataset):
            def __iter__(self):
                buffer = []
                for index in range(100_000):
                    buffer.append(torch.full((8192,), float(index)))  # here
                    if len(buffer) >= 64:
                        yield buffer.pop(0)

        class Loop:
            def __init__(self, loader):
                self.loader = loader
                self._iterator = None

            def step(self):
                if self._iterator is None:
                    self._iterator = iter(self.loader)
                return next(self._iterator)

        LOOP = Loop(torch.utils.data.DataLoader(Shuffled(), batch_size=None))

        def test_it():
            for _ in range(2):
                LOOP.step()
        """,
        fixed="""
        class Shuffled(torch.utils.data.IterableDataset):
            def __iter__(self):
                buffer = []
                for index in range(100_000):
                    buffer.append(torch.full((8192,), float(index)))
                    if len(buffer) >= 64:
                        yield buffer.pop(0)

        class Loop:
            def __init__(self, loader):
                self.loader = loader
                self._iterator = None

            def step(self):
                if self._iterator is None:
                    self._iterator = iter(self.loader)
                return next(self._iterator)

            def end_epoch(self):
                self._iterator = None

        LOOP = Loop(torch.utils.data.DataLoader(Shuffled(), batch_size=None))

        def test_it():
            for _ in range(2):
                LOOP.step()
            LOOP.end_epoch()
        """,
        holder="*LOOP._iterator*local 'buffer'*",
        diagnosis=("iterator", "generator"),
    ),
    # msamogh/nonechucks#13 (SafeDataset.__getitem__ memoizes every item it returns)
    Mechanism(
        name="memoized_getitem",
        kind="memoizing and lru_cache",
        source="msamogh/nonechucks#13",
        leak="""
        import functools, itertools

        def memoize(function):
            cache = {}

            @functools.wraps(function)
            def wrapper(*args):
                if args not in cache:
                    cache[args] = function(*args)
                return cache[args]

            return wrapper

        """
        + _MEMOIZED_DATASET,
        fixed=_DATASET_NOT_MEMOIZED,
        holder="*SafeDataset.__getitem__*closure var 'cache'*",
        diagnosis=("memoiz", "cache"),
    ),
    # msamogh/nonechucks#13 again, with nonechucks' memoize as released: it keeps its dict on the
    # dataset (obj.__cache), keyed by the function and the arguments
    Mechanism(
        name="memoized_getitem_on_the_instance",
        kind="memoizing and lru_cache",
        source="msamogh/nonechucks#13",
        leak="""
        import functools, itertools

        class memoize:
            def __init__(self, func):
                self.func = func

            def __get__(self, obj, objtype=None):
                return self.func if obj is None else functools.partial(self, obj)

            def __call__(self, *args, **kw):
                obj = args[0]
                try:
                    cache = obj.__cache
                except AttributeError:
                    cache = obj.__cache = {}
                key = (self.func, args[1:], frozenset(kw.items()))
                if key not in cache:
                    cache[key] = self.func(*args, **kw)
                return cache[key]

        """
        + _MEMOIZED_DATASET,
        fixed=_DATASET_NOT_MEMOIZED,
        holder="*DATASET._memoize__cache[[](<function key>, (*,), <frozenset key>)[]]",
        diagnosis=("memoiz", "DATASET._memoize__cache.clear()"),
    ),
    # pytorch/pytorch#147233, meta-pytorch/botorch#1650 and huggingface/transformers#45780
    # (lru_cache on a method keeps self, the whole model, alive in a cache on the class)
    Mechanism(
        name="lru_cache_on_a_method",
        kind="memoizing and lru_cache",
        source="huggingface/transformers#45780",
        leak="""
        import functools

        class Detector(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(32, 32)

            @functools.lru_cache(maxsize=32)
            def anchors(self, size):
                return torch.ones(size)  # here

        def test_it():
            model = Detector()
            assert model.anchors(2048).numel() == 2048
        """,
        fixed="""
        import functools

        @functools.lru_cache(maxsize=32)
        def anchors(size):
            return torch.ones(size)

        class Detector(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(32, 32)

            def anchors(self, size):
                return anchors(size).clone()

        def test_it():
            model = Detector()
            assert model.anchors(2048).numel() == 2048
        """,
        holder="*Detector.anchors*lru_cache*",
        diagnosis=("lru_cache", "self"),
    ),
    # alisaifee/coredis#376 and safe-global/safe-eth-py#339 (@property over @functools.cache: the
    # class's cache is keyed by self, so every instance read is kept with its result; fixed with
    # functools.cached_property, which keeps the value on the instance)
    Mechanism(
        name="cache_under_a_property",
        kind="memoizing and lru_cache",
        source="alisaifee/coredis#376",
        leak="""
        import functools

        class AnchorGenerator:
            def __init__(self, n):
                self.n = n

            @property
            @functools.cache
            def anchors(self):
                return torch.rand(self.n, 4)  # here

        def test_it():
            assert AnchorGenerator(2048).anchors.shape == (2048, 4)
        """,
        fixed="""
        import functools

        class AnchorGenerator:
            def __init__(self, n):
                self.n = n

            @functools.cached_property
            def anchors(self):
                return torch.rand(self.n, 4)

        def test_it():
            assert AnchorGenerator(2048).anchors.shape == (2048, 4)
        """,
        holder="*AnchorGenerator.anchors.fget -> lru_cache*",
        diagnosis=("@property", "every instance", "cached_property", "cache_clear"),
    ),
    # MoonshotAI/Kimi-Audio#117 (@lru_cache(maxsize=None) on a dataset's __getitem__)
    Mechanism(
        name="unbounded_lru_cache_on_getitem",
        kind="memoizing and lru_cache",
        source="MoonshotAI/Kimi-Audio#117",
        leak="""
        import functools, itertools

        class AudioDataset(torch.utils.data.Dataset):
            def __len__(self):
                return 1_000_000

            @functools.lru_cache(maxsize=None)
            def __getitem__(self, index):
                return {"input_ids": torch.full((2048,), float(index))}  # here

        DATASET = AudioDataset()
        INDEX = itertools.count()

        def test_it():
            assert DATASET[next(INDEX)]["input_ids"].numel() == 2048
        """,
        fixed="""
        import itertools

        class AudioDataset(torch.utils.data.Dataset):
            def __len__(self):
                return 1_000_000

            def __getitem__(self, index):
                return {"input_ids": torch.full((2048,), float(index))}

        DATASET = AudioDataset()
        INDEX = itertools.count()

        def test_it():
            assert DATASET[next(INDEX)]["input_ids"].numel() == 2048
        """,
        holder="*AudioDataset.__getitem__*lru_cache*",
        diagnosis=("lru_cache", "maxsize"),
    ),
    # meta-pytorch/torchtune#904 (@functools.lru_cache on get_adapter_params(model) keeps every model)
    Mechanism(
        name="lru_cache_keyed_by_a_model",
        kind="memoizing and lru_cache",
        source="meta-pytorch/torchtune#904",
        leak="""
        import functools

        @functools.lru_cache()
        def get_adapter_params(model):
            return {name: p for name, p in model.named_parameters() if "lora" in name}

        class LoRALinear(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lora_a = torch.nn.Parameter(torch.zeros(2048))  # here

        def test_it():
            model = LoRALinear()
            assert len(get_adapter_params(model)) == 1
        """,
        fixed="""
        def get_adapter_params(model):
            return {name: p for name, p in model.named_parameters() if "lora" in name}

        class LoRALinear(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lora_a = torch.nn.Parameter(torch.zeros(2048))

        def test_it():
            model = LoRALinear()
            assert len(get_adapter_params(model)) == 1
        """,
        holder="*get_adapter_params*lru_cache*",
        diagnosis=("lru_cache", "model"),
    ),
    # cornellius-gp/gpytorch#2734 (functools.partial(clear_cache_hook, self) registered on a cached
    # tensor's grad_fn: a cycle through a C++ node that Python's gc cannot see)
    Mechanism(
        name="partial_hook_on_grad_fn",
        kind="hooks",
        source="cornellius-gp/gpytorch#2734",
        leak="""
        import functools

        WEIGHT = torch.nn.Parameter(torch.ones(64))

        def clear_cache_hook(strategy, *args):
            strategy.mean_cache = None

        class PredictionStrategy:
            def __init__(self):
                self.covar = torch.ones(2048)  # here
                self.mean_cache = WEIGHT * 2.0
                self.mean_cache.grad_fn.register_hook(functools.partial(clear_cache_hook, self))

        def test_it():
            strategy = PredictionStrategy()
            assert strategy.mean_cache.shape == (64,)
        """,
        fixed="""
        import weakref

        WEIGHT = torch.nn.Parameter(torch.ones(64))

        class PredictionStrategy:
            def __init__(self):
                self.covar = torch.ones(2048)
                self.mean_cache = WEIGHT * 2.0
                owner = weakref.ref(self)

                def clear_cache_hook(*args):
                    strategy = owner()
                    if strategy is not None:
                        strategy.mean_cache = None

                self.mean_cache.grad_fn.register_hook(clear_cache_hook)

        def test_it():
            strategy = PredictionStrategy()
            assert strategy.mean_cache.shape == (64,)
        """,
        holder="*grad_fn*hook*covar*",
        diagnosis=("grad_fn", "weakref"),
    ),
    # fffasttime/MRFI#5 (hooks registered on every run with their handles discarded: each closure,
    # and what it captured, stays on the tensor)
    Mechanism(
        name="tensor_hook_closure_never_removed",
        kind="hooks",
        source="fffasttime/MRFI#5",
        leak="""
        MODEL = torch.nn.Linear(64, 64)

        def mask_gradients(model):
            mask = torch.ones(64, 64)  # here
            model.weight.register_hook(lambda grad: grad * mask)

        def test_it():
            mask_gradients(MODEL)
            MODEL(torch.ones(4, 64)).sum().backward()
            MODEL.zero_grad(set_to_none=True)
        """,
        fixed="""
        MODEL = torch.nn.Linear(64, 64)

        def mask_gradients(model):
            mask = torch.ones(64, 64)
            return model.weight.register_hook(lambda grad: grad * mask)

        def test_it():
            handle = mask_gradients(MODEL)
            MODEL(torch.ones(4, 64)).sum().backward()
            MODEL.zero_grad(set_to_none=True)
            handle.remove()
        """,
        holder="*MODEL.weight._backward_hooks[[]*closure var 'mask'*",
        diagnosis=("register_hook", "remove()"),
    ),
    # meta-pytorch/opacus#176 (forward hooks keep activations even under torch.no_grad())
    Mechanism(
        name="forward_hook_stores_activations",
        kind="hooks",
        source="meta-pytorch/opacus#176",
        leak="""
        MODEL = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())

        def capture_activations(module, inputs, output):
            if not hasattr(module, "activations"):
                module.activations = []
            module.activations.append(inputs[0].detach())

        MODEL[0].register_forward_hook(capture_activations)

        def test_it():
            with torch.no_grad():
                MODEL(torch.ones(32, 64))  # here
        """,
        fixed="""
        MODEL = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())

        def capture_activations(module, inputs, output):
            if module.training and torch.is_grad_enabled():
                if not hasattr(module, "activations"):
                    module.activations = []
                module.activations.append(inputs[0].detach())

        MODEL[0].register_forward_hook(capture_activations)

        def test_it():
            with torch.no_grad():
                MODEL(torch.ones(32, 64))
        """,
        holder="*MODEL[[]0[]].activations[[]*",
        diagnosis=("hook", "activations"),
    ),
    # jacobgil/pytorch-grad-cam#88 (a backward hook stores grad_output; each GradCAM object's hooks
    # stay registered on the model, keeping the object and its stored tensors)
    Mechanism(
        name="module_hooks_of_a_helper_never_removed",
        kind="hooks",
        source="jacobgil/pytorch-grad-cam#88",
        leak="""
        MODEL = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        class GradCAM:
            def __init__(self, model, layer):
                self.model = model
                self.activations = []
                self.gradients = []
                layer.register_forward_hook(self.save_activation)
                layer.register_full_backward_hook(self.save_gradient)

            def save_activation(self, module, inputs, output):
                self.activations.append(output.detach())

            def save_gradient(self, module, grad_input, grad_output):
                self.gradients.append(grad_output[0].detach())

            def __call__(self, batch):
                self.model(batch).sum().backward()  # here
                return self.activations[-1] * self.gradients[-1]

        def test_it():
            cam = GradCAM(MODEL, MODEL[0])
            cam(torch.ones(32, 64, requires_grad=True))
            MODEL.zero_grad(set_to_none=True)
        """,
        fixed="""
        MODEL = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        class GradCAM:
            def __init__(self, model, layer):
                self.model = model
                self.activations = []
                self.gradients = []
                self.handles = [
                    layer.register_forward_hook(self.save_activation),
                    layer.register_full_backward_hook(self.save_gradient),
                ]

            def save_activation(self, module, inputs, output):
                self.activations.append(output.detach())

            def save_gradient(self, module, grad_input, grad_output):
                self.gradients.append(grad_output[0].detach())

            def __call__(self, batch):
                self.model(batch).sum().backward()
                return self.activations[-1] * self.gradients[-1]

            def release(self):
                for handle in self.handles:
                    handle.remove()

        def test_it():
            cam = GradCAM(MODEL, MODEL[0])
            cam(torch.ones(32, 64, requires_grad=True))
            MODEL.zero_grad(set_to_none=True)
            cam.release()
        """,
        holder="*MODEL[[]0[]]._*hooks[[]*",
        diagnosis=("hook", "remove()"),
    ),
    # pytorch/pytorch#139214 (ModuleTracker's multi-grad hooks, registered from global module hooks,
    # piled up); a global forward hook registered on every run and never removed
    Mechanism(
        name="global_module_forward_hook",
        kind="hooks",
        source="pytorch/pytorch#139214",
        leak="""
        from torch.nn.modules.module import register_module_forward_hook

        MODEL = torch.nn.Linear(64, 64)

        def track_outputs():
            seen = []
            register_module_forward_hook(lambda module, args, out: seen.append(out.detach()))
            return seen

        def test_it():
            seen = track_outputs()
            with torch.no_grad():
                MODEL(torch.ones(32, 64))  # here
            assert len(seen) == 1
        """,
        fixed="""
        from torch.nn.modules.module import register_module_forward_hook

        MODEL = torch.nn.Linear(64, 64)

        def track_outputs():
            seen = []
            handle = register_module_forward_hook(lambda module, args, out: seen.append(out.detach()))
            return seen, handle

        def test_it():
            seen, handle = track_outputs()
            with torch.no_grad():
                MODEL(torch.ones(32, 64))
            assert len(seen) == 1
            handle.remove()
        """,
        holder="*_global_forward_hooks[[]*closure var 'seen'*",
        diagnosis=("global", "hook", "remove()"),
    ),
    # pytorch/pytorch#76434 (functools.partial(hook, module) registered by a module keeps it alive);
    # a post-accumulate-grad hook binding a per-run object to a long-lived parameter
    Mechanism(
        name="post_accumulate_grad_hook_partial",
        kind="hooks",
        source="pytorch/pytorch#76434",
        leak="""
        import functools

        MODEL = torch.nn.Linear(64, 64)

        class GradientLog:
            def __init__(self):
                self.norms = [torch.zeros(2048)]  # here

            def record(self, param):
                self.norms[0][0] = param.grad.norm()

        def test_it():
            log = GradientLog()
            MODEL.weight.register_post_accumulate_grad_hook(functools.partial(GradientLog.record, log))
            MODEL(torch.ones(4, 64)).sum().backward()
            MODEL.zero_grad(set_to_none=True)
        """,
        fixed="""
        import functools

        MODEL = torch.nn.Linear(64, 64)

        class GradientLog:
            def __init__(self):
                self.norms = [torch.zeros(2048)]

            def record(self, param):
                self.norms[0][0] = param.grad.norm()

        def test_it():
            log = GradientLog()
            handle = MODEL.weight.register_post_accumulate_grad_hook(functools.partial(GradientLog.record, log))
            MODEL(torch.ones(4, 64)).sum().backward()
            MODEL.zero_grad(set_to_none=True)
            handle.remove()
        """,
        holder="*MODEL.weight*hooks*norms*",
        diagnosis=("hook", "remove()"),
    ),
    # huggingface/accelerate#84 and #89 (an Accelerator reused across trainings keeps every prepared
    # optimizer, and its state, in a list; free_memory() releases them)
    Mechanism(
        name="registry_of_prepared_optimizers",
        kind="registries of prepared objects",
        source="huggingface/accelerate#84",
        leak="""
        class Accelerator:
            def __init__(self):
                self._models = []
                self._optimizers = []

            def prepare(self, model, optimizer):
                self._models.append(model)
                self._optimizers.append(optimizer)
                return model, optimizer

        ACCELERATOR = Accelerator()

        def test_it():
            model = torch.nn.Linear(32, 32)
            optimizer = torch.optim.Adam(model.parameters())
            model, optimizer = ACCELERATOR.prepare(model, optimizer)
            model(torch.ones(4, 32)).sum().backward()
            optimizer.step()  # here
        """,
        fixed="""
        class Accelerator:
            def __init__(self):
                self._models = []
                self._optimizers = []

            def prepare(self, model, optimizer):
                self._models.append(model)
                self._optimizers.append(optimizer)
                return model, optimizer

            def free_memory(self):
                self._models.clear()
                self._optimizers.clear()

        ACCELERATOR = Accelerator()

        def test_it():
            model = torch.nn.Linear(32, 32)
            optimizer = torch.optim.Adam(model.parameters())
            model, optimizer = ACCELERATOR.prepare(model, optimizer)
            model(torch.ones(4, 32)).sum().backward()
            optimizer.step()
            ACCELERATOR.free_memory()
        """,
        holder="*ACCELERATOR._optimizers[[]*state*",
        diagnosis=("optimizer", "registry"),
    ),
    # huggingface/accelerate#2716 and huggingface/transformers#28178 (prepared models kept by the
    # Accelerator's lists after the user dropped theirs)
    Mechanism(
        name="registry_of_prepared_models",
        kind="registries of prepared objects",
        source="huggingface/accelerate#2716",
        leak="""
        class Accelerator:
            def __init__(self):
                self._models = []

            def prepare_model(self, model):
                self._models.append(model)
                return model

        ACCELERATOR = Accelerator()

        def test_it():
            model = ACCELERATOR.prepare_model(torch.nn.Linear(64, 32))  # here
            with torch.no_grad():
                model(torch.ones(4, 64))
        """,
        fixed="""
        class Accelerator:
            def __init__(self):
                self._models = []

            def prepare_model(self, model):
                self._models.append(model)
                return model

            def free_memory(self):
                self._models.clear()

        ACCELERATOR = Accelerator()

        def test_it():
            model = ACCELERATOR.prepare_model(torch.nn.Linear(64, 32))
            with torch.no_grad():
                model(torch.ones(4, 64))
            ACCELERATOR.free_memory()
        """,
        holder="*ACCELERATOR._models[[]*weight*",
        diagnosis=("model", "registry"),
    ),
    # huggingface/peft#738 (adapters loaded one after another are never released; delete_adapter)
    Mechanism(
        name="adapters_kept_in_a_dict",
        kind="registries of prepared objects",
        source="huggingface/peft#738",
        leak="""
        import itertools

        class PeftModel(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.base = torch.nn.Linear(64, 64)
                self.adapters = torch.nn.ModuleDict()

            def load_adapter(self, name):
                self.adapters[name] = torch.nn.Linear(64, 32, bias=False)  # here

        PEFT_MODEL = PeftModel()
        ADAPTER_IDS = itertools.count()

        def test_it():
            name = f"adapter_{next(ADAPTER_IDS)}"
            PEFT_MODEL.load_adapter(name)
        """,
        fixed="""
        import itertools

        class PeftModel(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.base = torch.nn.Linear(64, 64)
                self.adapters = torch.nn.ModuleDict()

            def load_adapter(self, name):
                self.adapters[name] = torch.nn.Linear(64, 32, bias=False)

            def delete_adapter(self, name):
                del self.adapters[name]

        PEFT_MODEL = PeftModel()
        ADAPTER_IDS = itertools.count()

        def test_it():
            name = f"adapter_{next(ADAPTER_IDS)}"
            PEFT_MODEL.load_adapter(name)
            PEFT_MODEL.delete_adapter(name)
        """,
        holder="*PEFT_MODEL.adapters.adapter_*.weight*",
        diagnosis=("adapter", "delete"),
    ),
    # Tribler/tribler#8530 (a logging MemoryHandler buffers records) and deepmodeling/Uni-Mol#173
    # (logging the loss tensor, not loss.item(), kept its graph)
    Mechanism(
        name="logging_memory_handler_keeps_record_args",
        kind="logging and warnings",
        source="deepmodeling/Uni-Mol#173",
        leak="""
        import logging, logging.handlers

        LOGGER = logging.getLogger("train")
        LOGGER.setLevel(logging.INFO)
        LOGGER.propagate = False
        LOGGER.addHandler(logging.handlers.MemoryHandler(capacity=100_000, flushLevel=logging.CRITICAL))
        MODEL = torch.nn.Linear(64, 64)

        def test_it():
            loss = MODEL(torch.ones(256, 64)).pow(2).mean()  # here
            LOGGER.info("loss %s", loss)
        """,
        fixed="""
        import logging, logging.handlers

        LOGGER = logging.getLogger("train.fixed")
        LOGGER.setLevel(logging.INFO)
        LOGGER.propagate = False
        LOGGER.addHandler(logging.handlers.MemoryHandler(capacity=100_000, flushLevel=logging.CRITICAL))
        MODEL = torch.nn.Linear(64, 64)

        def test_it():
            loss = MODEL(torch.ones(256, 64)).pow(2).mean()
            LOGGER.info("loss %.4f", loss.item())
        """,
        holder="*LOGGER.handlers[[]0[]].buffer[[]*].args*",
        diagnosis=("log", ".item()"),
    ),
    # Tribler/tribler#8530 and the loggers that gain a handler on every run: each handler keeps the
    # model it reports on
    Mechanism(
        name="logging_handler_added_every_run",
        kind="logging and warnings",
        source="Tribler/tribler#8530",
        leak="""
        import logging

        class ModelStatsHandler(logging.Handler):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def emit(self, record):
                pass

        def test_it():
            model = torch.nn.Linear(64, 32)  # here
            logging.getLogger("stats").addHandler(ModelStatsHandler(model))
            logging.getLogger("stats").warning("started")
        """,
        fixed="""
        import logging

        class ModelStatsHandler(logging.Handler):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def emit(self, record):
                pass

        def test_it():
            model = torch.nn.Linear(64, 32)
            handler = ModelStatsHandler(model)
            logging.getLogger("stats.fixed").addHandler(handler)
            try:
                logging.getLogger("stats.fixed").warning("started")
            finally:
                logging.getLogger("stats.fixed").removeHandler(handler)
        """,
        holder="logging.getLogger('stats').handlers[[]*].model.weight",
        diagnosis=("handler", "removeHandler"),
    ),
    # python/cpython#97557 and POSYDON-code/POSYDON#364 (what a warning carries stays with whatever
    # records it); a trainer that collects the warnings of each fit, one built with the tensor itself
    Mechanism(
        name="warning_that_carries_a_tensor",
        kind="logging and warnings",
        source="python/cpython#97557",
        leak="""
        import warnings

        class LossSpike(UserWarning):
            pass

        class Trainer:
            def __init__(self):
                self.caught_warnings = []

            def fit(self, loss):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    if loss.max() > 10:
                        warnings.warn(LossSpike("loss spiked", loss))
                self.caught_warnings.extend(caught)

        TRAINER = Trainer()

        def test_it():
            TRAINER.fit(torch.ones(2048) * 100.0)  # here
        """,
        fixed="""
        import warnings

        class LossSpike(UserWarning):
            pass

        class Trainer:
            def __init__(self):
                self.caught_warnings = []

            def fit(self, loss):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    if loss.max() > 10:
                        warnings.warn(LossSpike(f"loss spiked to {loss.max().item():.1f}"))
                self.caught_warnings.extend(caught)

        TRAINER = Trainer()

        def test_it():
            TRAINER.fit(torch.ones(2048) * 100.0)
        """,
        holder="*TRAINER.caught_warnings[[]*].message*",
        diagnosis=("warning", ".item()"),
    ),
    # pytorch/pytorch#18853 (an exception object kept after a caught OOM holds its traceback and every
    # frame's tensors)
    Mechanism(
        name="exception_kept_after_oom",
        kind="tracebacks",
        source="pytorch/pytorch#18853",
        leak="""
        MODEL = torch.nn.Linear(64, 256)
        FAILED_BATCHES = []

        def train_step(batch):
            activations = MODEL(batch)  # here
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

        def test_it():
            try:
                train_step(torch.ones(64, 64))
            except RuntimeError as error:
                FAILED_BATCHES.append(error)
        """,
        fixed="""
        MODEL = torch.nn.Linear(64, 256)
        FAILED_BATCHES = []

        def train_step(batch):
            activations = MODEL(batch)
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

        def test_it():
            try:
                train_step(torch.ones(64, 64))
            except RuntimeError as error:
                FAILED_BATCHES.append(str(error))
        """,
        holder="*FAILED_BATCHES[[]*].__traceback__*local 'activations'*",
        diagnosis=("traceback", "clear_frames"),
    ),
    # TRI-ML/packnet-sfm#51 (each step's loss appended to the outputs after backward kept its graph's
    # nodes with it; detaching the loss before appending it fixed it)
    Mechanism(
        name="losses_appended_after_backward",
        kind="autograd graphs kept",
        source="TRI-ML/packnet-sfm#51",
        leak="""
        MODEL = torch.nn.Linear(64, 1)
        OUTPUTS = []

        def test_it():
            for _ in range(16):
                loss = MODEL(torch.ones(8, 64)).pow(2).mean()  # here
                loss.backward()
                OUTPUTS.append(loss)
        """,
        fixed="""
        MODEL = torch.nn.Linear(64, 1)
        OUTPUTS = []

        def test_it():
            for _ in range(16):
                loss = MODEL(torch.ones(8, 64)).pow(2).mean()
                loss.backward()
                OUTPUTS.append(loss.item())
        """,
        holder="*OUTPUTS[[]*",
        diagnosis=("carries the autograd graph", "loss.item()", "detach()"),
    ),
    # ray-project/ray#40940 (loss_sum += loss kept every step's autograd graph; .item() fixed it)
    Mechanism(
        name="loss_accumulated_with_its_graph",
        kind="autograd graphs kept",
        source="ray-project/ray#40940",
        leak="""
        MODEL = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))

        class Evaluator:
            def __init__(self):
                self.loss_sum = 0.0

        EVALUATOR = Evaluator()

        def test_it():
            out = MODEL(torch.ones(64, 64))  # here
            EVALUATOR.loss_sum += out.pow(2).mean()
        """,
        fixed="""
        MODEL = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))

        class Evaluator:
            def __init__(self):
                self.loss_sum = 0.0

        EVALUATOR = Evaluator()

        def test_it():
            out = MODEL(torch.ones(64, 64))
            EVALUATOR.loss_sum += out.pow(2).mean().item()
        """,
        holder="*EVALUATOR.loss_sum*",
        diagnosis=("graph", ".item()"),
    ),
    # Lightning-AI/pytorch-lightning#16520 and #1510 (step outputs collected for the epoch end, kept
    # with their graphs, never cleared)
    Mechanism(
        name="step_outputs_collected_with_graphs",
        kind="autograd graphs kept",
        source="Lightning-AI/pytorch-lightning#16520",
        leak="""
        class LitModel(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(64, 128)
                self.validation_step_outputs = []

            def validation_step(self, batch):
                loss = self.layer(batch).relu().mean()  # here
                self.validation_step_outputs.append(loss)
                return loss

        LIT_MODEL = LitModel()

        def test_it():
            LIT_MODEL.validation_step(torch.ones(64, 64))
        """,
        fixed="""
        class LitModel(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(64, 128)
                self.validation_step_outputs = []

            def validation_step(self, batch):
                loss = self.layer(batch).relu().mean()
                self.validation_step_outputs.append(loss.detach())
                return loss

            def on_validation_epoch_end(self):
                self.validation_step_outputs.clear()

        LIT_MODEL = LitModel()

        def test_it():
            LIT_MODEL.validation_step(torch.ones(64, 64))
            LIT_MODEL.on_validation_epoch_end()
        """,
        holder="*LIT_MODEL.validation_step_outputs[[]*",
        diagnosis=("graph", "detach"),
    ),
    # rabbityl/lepard#12 (AverageMeter.update(loss) with a tensor kept the graph; detach fixed it)
    Mechanism(
        name="average_meter_of_tensors",
        kind="metrics and meters",
        source="rabbityl/lepard#12",
        leak="""
        MODEL = torch.nn.Linear(64, 256)

        class AverageMeter:
            def __init__(self):
                self.sum = 0.0
                self.count = 0

            def update(self, value, n=1):
                self.sum += value * n
                self.count += n

        LOSS_METER = AverageMeter()

        def test_it():
            loss = MODEL(torch.ones(128, 64)).tanh().mean()  # here
            LOSS_METER.update(loss)
        """,
        fixed="""
        MODEL = torch.nn.Linear(64, 256)

        class AverageMeter:
            def __init__(self):
                self.sum = 0.0
                self.count = 0

            def update(self, value, n=1):
                self.sum += value * n
                self.count += n

        LOSS_METER = AverageMeter()

        def test_it():
            loss = MODEL(torch.ones(128, 64)).tanh().mean()
            LOSS_METER.update(loss.item())
        """,
        holder="*LOSS_METER.sum*",
        diagnosis=("graph", ".item()"),
    ),
    # Lightning-AI/torchmetrics#1949 and #2492 (a metric's list states grow until reset())
    Mechanism(
        name="metric_list_state_never_reset",
        kind="metrics and meters",
        source="Lightning-AI/torchmetrics#1949",
        leak="""
        class BinaryAUROC:
            def __init__(self):
                self.preds = []
                self.target = []

            def update(self, preds, target):
                self.preds.append(preds)
                self.target.append(target)

            def compute(self):
                return torch.cat(self.preds).mean()

            def reset(self):
                self.preds.clear()
                self.target.clear()

        METRIC = BinaryAUROC()

        def test_it():
            METRIC.update(torch.rand(2048), torch.ones(2048))  # here
            METRIC.compute()
        """,
        fixed="""
        class BinaryAUROC:
            def __init__(self):
                self.preds = []
                self.target = []

            def update(self, preds, target):
                self.preds.append(preds)
                self.target.append(target)

            def compute(self):
                return torch.cat(self.preds).mean()

            def reset(self):
                self.preds.clear()
                self.target.clear()

        METRIC = BinaryAUROC()

        def test_it():
            METRIC.update(torch.rand(2048), torch.ones(2048))
            METRIC.compute()
            METRIC.reset()
        """,
        holder="*METRIC.*[[]*",
        diagnosis=("metric", "reset()"),
    ),
    # Lightning-AI/torchmetrics#1949 again, the metric a module-scoped fixture shares between tests
    Mechanism(
        name="metric_of_a_fixture_never_reset",
        kind="metrics and meters",
        source="Lightning-AI/torchmetrics#1949",
        leak=_METRIC_OF_A_FIXTURE
        + """
        def test_it(val_metric):
            val_metric.update(torch.rand(2048))  # here
            val_metric.compute()
        """,
        fixed=_METRIC_OF_A_FIXTURE
        + """
        def test_it(val_metric):
            val_metric.update(torch.rand(2048))
            val_metric.compute()
            val_metric.reset()
        """,
        holder="fixture 'val_metric' (module scope).preds[[]*[]]",
        diagnosis=("val_metric.reset()",),
    ),
    # ViCCo-Group/thingsvision#150 (keeping only the cls token, a view, kept the whole output); kept
    # once, but the storage behind the one small view is large
    Mechanism(
        name="small_view_keeps_a_large_storage",
        kind="views and storages",
        source="ViCCo-Group/thingsvision#150",
        leak="""
        ENCODER = torch.nn.Linear(64, 128)
        LAST = {}

        def test_it():
            with torch.no_grad():
                hidden = ENCODER(torch.ones(4096, 64))  # here
            LAST["cls_token"] = hidden[0]
        """,
        fixed="""
        ENCODER = torch.nn.Linear(64, 128)
        LAST = {}

        def test_it():
            with torch.no_grad():
                hidden = ENCODER(torch.ones(4096, 64))
            LAST["cls_token"] = hidden[0].clone()
        """,
        holder="*LAST[[]'cls_token'[]]*",
        diagnosis=("view", "clone()"),
    ),
    # graphdeco-inria/gaussian-splatting#897 (replacing a parameter without moving its optimizer state
    # leaves the old parameter and its Adam moments in optimizer.state)
    Mechanism(
        name="optimizer_state_of_replaced_parameters",
        kind="optimizer state",
        source="graphdeco-inria/gaussian-splatting#897",
        leak="""
        POINTS = torch.nn.Parameter(torch.ones(512, 3))
        OPTIMIZER = torch.optim.Adam([POINTS])

        def densify(optimizer):
            group = optimizer.param_groups[0]
            old = group["params"][0]
            group["params"][0] = torch.nn.Parameter(old.detach().clone())

        def test_it():
            OPTIMIZER.param_groups[0]["params"][0].sum().backward()
            OPTIMIZER.step()  # here
            OPTIMIZER.zero_grad(set_to_none=True)
            densify(OPTIMIZER)
        """,
        fixed="""
        POINTS = torch.nn.Parameter(torch.ones(512, 3))
        OPTIMIZER = torch.optim.Adam([POINTS])

        def densify(optimizer):
            group = optimizer.param_groups[0]
            old = group["params"][0]
            stored = optimizer.state.pop(old, None)
            new = torch.nn.Parameter(old.detach().clone())
            group["params"][0] = new
            if stored is not None:
                optimizer.state[new] = stored

        def test_it():
            OPTIMIZER.param_groups[0]["params"][0].sum().backward()
            OPTIMIZER.step()
            OPTIMIZER.zero_grad(set_to_none=True)
            densify(OPTIMIZER)
        """,
        holder="*OPTIMIZER.state*",
        diagnosis=("optimizer", "state"),
    ),
    # discuss.pytorch.org/t/194782 (a growing architecture: layers appended to a ModuleList and their
    # parameters given to the optimizer with add_param_group; model and optimizer kept for the session)
    Mechanism(
        name="model_grown_with_add_param_group",
        kind="optimizer state",
        source="discuss.pytorch.org/t/194782",
        leak="""
        class Growing(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = torch.nn.ModuleList([torch.nn.Linear(128, 128)])

            def forward(self, x):
                return torch.stack([layer(x) for layer in self.layers]).sum(0)

            def grow(self, optimizer):
                self.layers.append(torch.nn.Linear(128, 128))
                optimizer.add_param_group({"params": list(self.layers[-1].parameters())})

        MODEL = Growing()
        OPTIMIZER = torch.optim.Adam(MODEL.parameters())

        def test_it():
            MODEL.grow(OPTIMIZER)
            MODEL(torch.ones(4, 128)).pow(2).mean().backward()
            OPTIMIZER.step()  # here
        """,
        fixed="""
        class Growing(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = torch.nn.ModuleList([torch.nn.Linear(128, 128)])

            def forward(self, x):
                return torch.stack([layer(x) for layer in self.layers]).sum(0)

            def grow(self, optimizer):
                self.layers.append(torch.nn.Linear(128, 128))
                optimizer.add_param_group({"params": list(self.layers[-1].parameters())})

        def test_it():
            model = Growing()
            optimizer = torch.optim.Adam(model.parameters())
            model.grow(optimizer)
            model(torch.ones(4, 128)).pow(2).mean().backward()
            optimizer.step()
        """,
        holder="*OPTIMIZER.state*",
        diagnosis=("add_param_group", "function-scoped fixture"),
    ),
    # pytorch/pytorch#40157 and #33101 (a slice of a tensor is a view on its whole storage; what
    # torch.load returns for a saved slice, and any slice of what it loads, keeps all of it)
    Mechanism(
        name="slice_of_a_loaded_checkpoint",
        kind="views and storages",
        source="pytorch/pytorch#40157",
        leak="""
        import io

        CHECKPOINT = io.BytesIO()
        torch.save({"embed": torch.ones(4096, 128)}, CHECKPOINT)
        USER_VECTORS = {}

        def test_it():
            CHECKPOINT.seek(0)
            state = torch.load(CHECKPOINT)  # here
            USER_VECTORS["user-42"] = state["embed"][42]
        """,
        fixed="""
        import io

        CHECKPOINT = io.BytesIO()
        torch.save({"embed": torch.ones(4096, 128)}, CHECKPOINT)
        USER_VECTORS = {}

        def test_it():
            CHECKPOINT.seek(0)
            state = torch.load(CHECKPOINT)
            USER_VECTORS["user-42"] = state["embed"][42].clone()
        """,
        holder="*USER_VECTORS[[]'user-42'[]]*",
        diagnosis=("view", "clone()"),
    ),
    # python/cpython#133423 and bpo-28318 (a mock keeps references to the arguments of every call)
    Mechanism(
        name="mock_keeps_every_call",
        kind="logging and warnings",
        source="python/cpython#133423",
        leak="""
        from unittest import mock

        REPORTER = mock.Mock()

        def evaluate(reporter):
            scores = torch.rand(2048)  # here
            reporter.log_scores(scores)

        def test_it():
            evaluate(REPORTER)
            assert REPORTER.log_scores.called
        """,
        fixed="""
        from unittest import mock

        def evaluate(reporter):
            scores = torch.rand(2048)
            reporter.log_scores(scores)

        def test_it():
            reporter = mock.Mock()
            evaluate(reporter)
            assert reporter.log_scores.called
        """,
        holder="*REPORTER*",
        diagnosis=("mock", "call"),
    ),
    # pnbruckner/ha-life360#101 (done tasks kept in a collection, each with its result) and the set of
    # background tasks asyncio's documentation asks for, without its done callback that discards them
    Mechanism(
        name="asyncio_tasks_kept_after_done",
        kind="asyncio tasks",
        source="pnbruckner/ha-life360#101",
        leak="""
        import asyncio

        MODEL = torch.nn.Linear(256, 256)
        BACKGROUND = set()

        async def infer(batch):
            with torch.no_grad():
                return MODEL(batch)  # here

        async def serve(batch):
            task = asyncio.create_task(infer(batch))
            BACKGROUND.add(task)
            return await task

        def test_it():
            assert asyncio.run(serve(torch.ones(64, 256))).shape == (64, 256)
        """,
        fixed="""
        import asyncio

        MODEL = torch.nn.Linear(256, 256)
        BACKGROUND = set()

        async def infer(batch):
            with torch.no_grad():
                return MODEL(batch)

        async def serve(batch):
            task = asyncio.create_task(infer(batch))
            BACKGROUND.add(task)
            task.add_done_callback(BACKGROUND.discard)
            return await task

        def test_it():
            assert asyncio.run(serve(torch.ones(64, 256))).shape == (64, 256)
        """,
        holder="*BACKGROUND -> set element._result*",
        diagnosis=("asyncio task", "add_done_callback"),
    ),
    # run-llama/llama-agents#486 (a ContextVar left set pinned each run's state) and the tracing spans
    # that nest through a ContextVar set and never reset: each run's span keeps the one before
    Mechanism(
        name="context_variable_never_reset",
        kind="context variables",
        source="run-llama/llama-agents#486",
        leak="""
        import contextvars

        MODEL = torch.nn.Linear(256, 256)
        SPAN = contextvars.ContextVar("span", default=None)

        class Span:
            def __init__(self, name, parent):
                self.name, self.parent, self.outputs = name, parent, []

        def traced_forward(batch):
            SPAN.set(Span("forward", SPAN.get()))
            with torch.no_grad():
                out = MODEL(batch)  # here
            SPAN.get().outputs.append(out)
            return out

        def test_it():
            assert traced_forward(torch.ones(64, 256)).shape == (64, 256)
        """,
        fixed="""
        import contextvars

        MODEL = torch.nn.Linear(256, 256)
        SPAN = contextvars.ContextVar("span", default=None)

        class Span:
            def __init__(self, name, parent):
                self.name, self.parent, self.outputs = name, parent, []

        def traced_forward(batch):
            token = SPAN.set(Span("forward", SPAN.get()))
            try:
                with torch.no_grad():
                    out = MODEL(batch)
                SPAN.get().outputs.append(out)
                return out
            finally:
                SPAN.reset(token)

        def test_it():
            assert traced_forward(torch.ones(64, 256)).shape == (64, 256)
        """,
        holder="*[[]ContextVar 'span'[]]*",
        diagnosis=("ContextVar", "reset"),
    ),
    # vllm-project/llm-compressor#2387: a cache of offloaded tensors in torch's weak-key dictionary;
    # where the tensor is on the offload device already, .to() returns the tensor itself, the value is
    # the key, and the entry (with its key) is never dropped
    Mechanism(
        name="weak_tensor_key_dictionary_value_is_its_key",
        kind="dict keys and weak-key dictionaries",
        source="vllm-project/llm-compressor#2387",
        leak="""
        from torch.utils.weak import WeakTensorKeyDictionary

        OFFLOADED = WeakTensorKeyDictionary()

        def offload(tensor, device="cpu"):
            if tensor not in OFFLOADED:
                OFFLOADED[tensor] = tensor.to(device)
            return OFFLOADED[tensor]

        def test_it():
            activations = torch.randn(2048)  # here
            assert offload(activations).shape == (2048,)
        """,
        fixed="""
        from torch.utils.weak import WeakTensorKeyDictionary

        OFFLOADED = WeakTensorKeyDictionary()

        def offload(tensor, device="cpu"):
            if tensor.device == torch.device(device):
                return tensor
            if tensor not in OFFLOADED:
                OFFLOADED[tensor] = tensor.to(device)
            return OFFLOADED[tensor]

        def test_it():
            activations = torch.randn(2048)
            assert offload(activations).shape == (2048,)
        """,
        holder="*OFFLOADED.data[[]*[]]",
        diagnosis=("weak-key dictionary", "its own key", "weakref.ref(key)"),
    ),
    # Stonesjtu/pytorch_memlab#17 (fixed in #18): the memory reporter mapped tensors to their names
    # in a dict keyed by the tensors themselves, so every tensor it ever named stayed alive
    Mechanism(
        name="dict_keyed_by_tensors",
        kind="dict keys and weak-key dictionaries",
        source="Stonesjtu/pytorch_memlab#17",
        leak="""
        class MemReporter:
            def __init__(self):
                self.tensor_name = {}

            def collect(self, named_tensors):
                for name, tensor in named_tensors.items():
                    self.tensor_name[tensor] = name

        REPORTER = MemReporter()

        def test_it():
            hidden = torch.randn(2048)  # here
            REPORTER.collect({"hidden": hidden})
            assert REPORTER.tensor_name[hidden] == "hidden"
        """,
        fixed="""
        class MemReporter:
            def __init__(self):
                self.tensor_name = {}

            def collect(self, named_tensors):
                for name, tensor in named_tensors.items():
                    self.tensor_name[id(tensor)] = name

        REPORTER = MemReporter()

        def test_it():
            hidden = torch.randn(2048)
            REPORTER.collect({"hidden": hidden})
            assert REPORTER.tensor_name[id(hidden)] == "hidden"
            REPORTER.tensor_name.clear()
        """,
        holder="*REPORTER.tensor_name -> dict key",
        diagnosis=("dict keeps its keys", "id(tensor)", "WeakTensorKeyDictionary"),
    ),
    # cool-RR/PySnooper#111: the tracer (sys.settrace) kept every frame it traced, with all its local
    # variables, in a dict keyed by frame; fixed by dropping the frame's entry as it returns
    Mechanism(
        name="tracer_keeps_frames",
        kind="frames kept",
        source="cool-RR/PySnooper#111",
        leak="""
        import sys

        FRAME_TO_LOCAL_REPRS = {}

        def tracer(frame, event, arg):
            if frame.f_code.co_name != "forward":
                return None
            FRAME_TO_LOCAL_REPRS[frame] = {k: repr(v)[:40] for k, v in frame.f_locals.items()}
            return tracer

        def forward(x):
            hidden = torch.cat([x, x])  # here
            return hidden.sum()

        def test_it():
            old = sys.gettrace()
            sys.settrace(tracer)
            try:
                assert forward(torch.ones(2048)) == 4096
            finally:
                sys.settrace(old)
        """,
        fixed="""
        import sys

        FRAME_TO_LOCAL_REPRS = {}

        def tracer(frame, event, arg):
            if frame.f_code.co_name != "forward":
                return None
            if event == "return":
                FRAME_TO_LOCAL_REPRS.pop(frame, None)
                return None
            FRAME_TO_LOCAL_REPRS[frame] = {k: repr(v)[:40] for k, v in frame.f_locals.items()}
            return tracer

        def forward(x):
            hidden = torch.cat([x, x])
            return hidden.sum()

        def test_it():
            old = sys.gettrace()
            sys.settrace(tracer)
            try:
                assert forward(torch.ones(2048)) == 4096
            finally:
                sys.settrace(old)
        """,
        holder="*FRAME_TO_LOCAL_REPRS -> dict key local 'hidden'",
        diagnosis=("frame object is kept", "every local", "never the frame"),
    ),
    # allenai/OLMo-core#856: an async checkpoint submits its staged copy of the state dict to a
    # ThreadPoolExecutor, whose work item keeps it until the upload runs; saves faster than uploads
    # pile staged copies up in the executor's queue (the slow remote store is let go as the session ends)
    Mechanism(
        name="executor_queue_holds_staged_state",
        kind="executors",
        source="allenai/OLMo-core#856",
        leak="""
        import threading
        from concurrent.futures import ThreadPoolExecutor

        MODEL = torch.nn.Linear(64, 64)
        UPLOADER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-upload")
        REMOTE_STORE_SLOW = threading.Event()

        @pytest.fixture(scope="session", autouse=True)
        def remote_store():
            yield
            REMOTE_STORE_SLOW.set()

        def upload(state_dict):
            REMOTE_STORE_SLOW.wait(timeout=30)
            return len(state_dict)

        def save_async(model):
            staged = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}  # here
            return UPLOADER.submit(upload, staged)

        def test_it():
            future = save_async(MODEL)
            assert not future.done()
        """,
        fixed="""
        import threading
        from concurrent.futures import ThreadPoolExecutor

        MODEL = torch.nn.Linear(64, 64)
        UPLOADER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-upload")

        def upload(state_dict):
            return len(state_dict)

        def save_async(model):
            staged = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
            return UPLOADER.submit(upload, staged)

        def test_it():
            future = save_async(MODEL)
            assert future.result() == 2
        """,
        holder="*<SimpleQueue>[[]*[]].args[[]0[]][[]'weight'[]]",
        diagnosis=("executor", "has not run", "future.result()", "cancel_futures"),
    ),
    # schematics/schematics#501 and marshmallow-code/marshmallow#732: every model class made at run
    # time registered itself on its base, so no generated class, nor what it held, was freed
    Mechanism(
        name="registry_of_classes_made_at_run_time",
        kind="class attributes",
        source="schematics/schematics#501",
        leak="""
        class Model:
            _subclasses = []

            def __init_subclass__(cls, **kwargs):
                super().__init_subclass__(**kwargs)
                Model._subclasses.append(cls)

        def model_class_from_config(name, vocab_size):
            return type(name, (Model,), {"embedding": torch.randn(vocab_size, 16)})  # here

        def test_it():
            cls = model_class_from_config("Tokenizer", 128)
            assert cls.embedding.shape == (128, 16)
        """,
        fixed="""
        import weakref

        class Model:
            _subclasses = weakref.WeakSet()

            def __init_subclass__(cls, **kwargs):
                super().__init_subclass__(**kwargs)
                Model._subclasses.add(cls)

        def model_class_from_config(name, vocab_size):
            return type(name, (Model,), {"embedding": torch.randn(vocab_size, 16)})

        def test_it():
            cls = model_class_from_config("Tokenizer", 128)
            assert cls.embedding.shape == (128, 16)
        """,
        holder="*Model._subclasses[[]*[]].embedding",
        diagnosis=("keeps every class added to it", "__init_subclass__", "weakref.WeakSet"),
    ),
    # gc.DEBUG_SAVEALL (part of gc.DEBUG_LEAK) left on after a leak hunt (sgl-project/sglang#9673 turned
    # it on in a server to list what was not reclaimed): every unreachable cycle goes to gc.garbage
    # gc.freeze() after a first round, to make later collections cheap, freezes a client that lies on
    # a reference cycle (it keeps its own bound method): garbage once the round returns, and never collected
    Mechanism(
        name="cycle_frozen_with_the_heap",
        kind="garbage collector settings",
        source="VectorInstitute/FL4Health#222",
        leak="""
        import gc

        class Client:
            def __init__(self):
                self.state = torch.randn(4096)  # here
                self.on_round_end = self.report  # a cycle: the client keeps its own bound method

            def report(self):
                return float(self.state.sum())

        def run_round():
            client = Client()
            client.on_round_end()
            gc.freeze()  # later collections are cheaper

        def test_it():
            run_round()
        """,
        fixed="""
        import gc

        class Client:
            def __init__(self):
                self.state = torch.randn(4096)
                self.on_round_end = self.report  # a cycle: the client keeps its own bound method

            def report(self):
                return float(self.state.sum())

        def run_round():
            client = Client()
            client.on_round_end()
            gc.freeze()  # later collections are cheaper

        def test_it():
            try:
                run_round()
            finally:
                gc.unfreeze()
        """,
        holder="<Client on a reference cycle frozen with the heap (gc.freeze()), or kept from outside Python's gc>.state",
        diagnosis=("the heap was frozen (gc.freeze())", "gc.unfreeze()", "weakref.WeakMethod"),
    ),
    Mechanism(
        name="gc_debug_saveall_left_on",
        kind="garbage collector settings",
        source="sgl-project/sglang#9673",
        leak="""
        import gc

        class Node:
            def __init__(self, value):
                self.value = value
                self.children = [self]

        def test_it():
            gc.set_debug(gc.DEBUG_SAVEALL)
            node = Node(torch.randn(2048))  # here
            del node
            gc.collect()
            assert gc.garbage
        """,
        fixed="""
        import gc

        class Node:
            def __init__(self, value):
                self.value = value
                self.children = [self]

        def test_it():
            flags = gc.get_debug()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                node = Node(torch.randn(2048))
                del node
                gc.collect()
                assert gc.garbage
            finally:
                gc.set_debug(flags)
                gc.garbage.clear()
        """,
        holder="gc.garbage[[]*[]]*",
        diagnosis=("gc.DEBUG_SAVEALL", "gc.set_debug(flags)", "gc.garbage.clear()"),
    ),
    # radixark/miles#1472: each trainer installed a SIGUSR1 handler that saves its checkpoint and calls
    # the handler it replaced; the signal module keeps the newest, and through each `prev` every trainer
    Mechanism(
        name="signal_handler_chain",
        kind="signal handlers",
        source="radixark/miles#1472",
        leak="""
        import signal

        class Trainer:
            def __init__(self):
                self.model = torch.nn.Linear(64, 64)  # here
                prev = signal.getsignal(signal.SIGUSR1)

                def handler(signum, frame):
                    torch.save(self.model.state_dict(), "/dev/null")
                    if callable(prev):
                        prev(signum, frame)

                signal.signal(signal.SIGUSR1, handler)

        def test_it():
            trainer = Trainer()
            assert trainer.model(torch.ones(4, 64)).shape == (4, 64)
        """,
        fixed="""
        import signal

        class Trainer:
            def __init__(self):
                self.model = torch.nn.Linear(64, 64)
                prev = self.previous = signal.getsignal(signal.SIGUSR1)

                def handler(signum, frame):
                    torch.save(self.model.state_dict(), "/dev/null")
                    if callable(prev):
                        prev(signum, frame)

                signal.signal(signal.SIGUSR1, handler)

            def close(self):
                signal.signal(signal.SIGUSR1, self.previous)

        def test_it():
            trainer = Trainer()
            assert trainer.model(torch.ones(4, 64)).shape == (4, 64)
            trainer.close()
        """,
        holder="the SIGUSR1 handler (Trainer.__init__.<locals>.handler) -> closure var 'self'.model.weight",
        diagnosis=("signal module keeps the SIGUSR1 handler", "signal.signal(sig, previous)"),
    ),
    # simonsobs/sotodlib#884 (and bpo-27144): every future submitted to an executor was kept in a list
    # after it was done, and each kept its result
    Mechanism(
        name="futures_kept_after_done",
        kind="executors",
        source="simonsobs/sotodlib#884",
        leak="""
        from concurrent.futures import ThreadPoolExecutor

        MODEL = torch.nn.Linear(256, 256)
        EXECUTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="infer")
        SUBMITTED = []

        def infer(batch):
            with torch.no_grad():
                return MODEL(batch)  # here

        def submit(batch):
            future = EXECUTOR.submit(infer, batch)
            SUBMITTED.append(future)
            return future

        def test_it():
            assert submit(torch.ones(64, 256)).result().shape == (64, 256)
        """,
        fixed="""
        from concurrent.futures import ThreadPoolExecutor

        MODEL = torch.nn.Linear(256, 256)
        EXECUTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="infer")
        SUBMITTED = []

        def infer(batch):
            with torch.no_grad():
                return MODEL(batch)

        def submit(batch):
            future = EXECUTOR.submit(infer, batch)
            SUBMITTED.append(future)
            future.add_done_callback(SUBMITTED.remove)
            return future

        def test_it():
            assert submit(torch.ones(64, 256)).result().shape == (64, 256)
        """,
        holder="*SUBMITTED[[]*[]]._result",
        diagnosis=("concurrent.futures", "future.add_done_callback(futures.remove)"),
    ),
    # python/cpython#138765: itertools.tee keeps every item one branch read until the other reads it;
    # a branch never read keeps them all
    Mechanism(
        name="itertools_tee_branch_never_read",
        kind="caching iterators",
        source="python/cpython#138765",
        leak="""
        import itertools

        def batches():
            step = 0
            while True:
                step += 1
                yield torch.full((2048,), float(step))  # here

        TRAIN, PREVIEW = itertools.tee(batches())

        def test_it():
            assert next(TRAIN).numel() == 2048
        """,
        fixed="""
        def batches():
            step = 0
            while True:
                step += 1
                yield torch.full((2048,), float(step))

        TRAIN = batches()

        def test_it():
            assert next(TRAIN).numel() == 2048
        """,
        holder="*TRAIN -> <_tee> -> <_tee_dataobject>",
        diagnosis=("itertools.tee", "branch that lags"),
    ),
    # python/cpython#125756: a Pickler reused across dump() calls keeps every object it pickled in its
    # memo until clear_memo()
    Mechanism(
        name="pickler_memo_reused",
        kind="memoizing and lru_cache",
        source="python/cpython#125756",
        leak="""
        import io
        import pickle

        STREAM = io.BytesIO()
        PICKLER = pickle.Pickler(STREAM, protocol=pickle.HIGHEST_PROTOCOL)

        def test_it():
            activations = torch.randn(2048)  # here
            PICKLER.dump((1, activations))
            assert STREAM.tell() > 0
        """,
        fixed="""
        import io
        import pickle

        STREAM = io.BytesIO()
        PICKLER = pickle.Pickler(STREAM, protocol=pickle.HIGHEST_PROTOCOL)

        def test_it():
            activations = torch.randn(2048)
            PICKLER.dump((1, activations))
            PICKLER.clear_memo()
            assert STREAM.tell() > 0
        """,
        holder="*PICKLER -> <Pickler>*",
        diagnosis=("pickle.Pickler", "clear_memo()"),
    ),
    # jina-ai/serve#3739: a module-level ExitStack never closed kept every callback registered on it,
    # with its arguments
    Mechanism(
        name="exit_stack_never_closed",
        kind="callbacks waiting to run",
        source="jina-ai/serve#3739",
        leak="""
        import contextlib

        RESOURCES = contextlib.ExitStack()

        def release(buffer):
            buffer.zero_()

        def acquire_buffer():
            buffer = torch.empty(2048)  # here
            RESOURCES.callback(release, buffer)
            return buffer

        def test_it():
            assert acquire_buffer().fill_(1.0).sum() == 2048
        """,
        fixed="""
        import contextlib

        def release(buffer):
            buffer.zero_()

        def acquire_buffer(resources):
            buffer = torch.empty(2048)
            resources.callback(release, buffer)
            return buffer

        def test_it():
            with contextlib.ExitStack() as resources:
                assert acquire_buffer(resources).fill_(1.0).sum() == 2048
        """,
        holder="*RESOURCES._exit_callbacks[[]*",
        diagnosis=("ExitStack", "close()"),
    ),
    # python/cpython#85865: callbacks scheduled on an event loop that nothing runs wait in its queue,
    # with their arguments
    Mechanism(
        name="event_loop_never_run",
        kind="callbacks waiting to run",
        source="python/cpython#85865",
        leak="""
        import asyncio

        LOOP = asyncio.new_event_loop()  # the service's loop, whose thread was never started
        MODEL = torch.nn.Linear(256, 256)
        SCORES = []

        def publish(output):
            SCORES.append(output.mean().item())

        def infer(batch):
            with torch.no_grad():
                output = MODEL(batch)  # here
            LOOP.call_soon_threadsafe(publish, output)
            return output

        def test_it():
            assert infer(torch.ones(64, 256)).shape == (64, 256)
        """,
        fixed="""
        import asyncio

        LOOP = asyncio.new_event_loop()
        MODEL = torch.nn.Linear(256, 256)
        SCORES = []

        def publish(output):
            SCORES.append(output.mean().item())

        def infer(batch):
            with torch.no_grad():
                output = MODEL(batch)
            LOOP.call_soon_threadsafe(publish, output)
            return output

        def test_it():
            assert infer(torch.ones(64, 256)).shape == (64, 256)
            LOOP.run_until_complete(asyncio.sleep(0))
        """,
        holder="*LOOP._ready[[]*[]]._args[[]0[]]",
        diagnosis=("event loop", "loop.close()"),
    ),
    # pytorch/pytorch#182317: a TorchFunctionMode entered with __enter__() and never exited stays on
    # torch's mode stack, with what it records, and runs on every later call
    Mechanism(
        name="torch_function_mode_never_exited",
        kind="torch modes",
        source="pytorch/pytorch#182317",
        leak="""
        from torch.overrides import TorchFunctionMode

        class RecordLinearOutputs(TorchFunctionMode):
            def __init__(self):
                super().__init__()
                self.outputs = []

            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))  # here
                if func is torch.nn.functional.linear:
                    self.outputs.append(out)
                return out

        MODEL = torch.nn.Linear(256, 256)

        def test_it():
            recorder = RecordLinearOutputs()
            recorder.__enter__()
            with torch.no_grad():
                MODEL(torch.ones(64, 256))
            assert recorder.outputs
        """,
        fixed="""
        from torch.overrides import TorchFunctionMode

        class RecordLinearOutputs(TorchFunctionMode):
            def __init__(self):
                super().__init__()
                self.outputs = []

            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is torch.nn.functional.linear:
                    self.outputs.append(out)
                return out

        MODEL = torch.nn.Linear(256, 256)

        def test_it():
            with RecordLinearOutputs() as recorder, torch.no_grad():
                MODEL(torch.ones(64, 256))
            assert recorder.outputs
        """,
        holder="torch's TorchFunctionMode stack[[]*[]] (RecordLinearOutputs, entered and not exited).outputs[[]*[]]",
        diagnosis=("mode entered and not exited", "with block", "__exit__"),
    ),
    # PolicyEngine/policyengine-core#520: each call generated a module under a new name, registered it
    # in sys.modules and executed its source there; sys.modules kept every one, with its globals
    Mechanism(
        name="generated_module_kept_in_sys_modules",
        kind="modules made at run time",
        source="PolicyEngine/policyengine-core#520",
        leak="""
        import importlib.util
        import itertools
        import sys

        COUNTER = itertools.count()
        SOURCE = "import torch\\nWEIGHTS = torch.randn(2048)\\n"

        def load_generated_module():
            name = f"generated_layer_{next(COUNTER)}"
            module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
            sys.modules[name] = module
            exec(compile(SOURCE, f"<{name}>", "exec"), module.__dict__)  # here
            return module

        def test_it():
            assert load_generated_module().WEIGHTS.shape == (2048,)
        """,
        fixed="""
        import importlib.util
        import itertools
        import sys

        COUNTER = itertools.count()
        SOURCE = "import torch\\nWEIGHTS = torch.randn(2048)\\n"

        def load_generated_module():
            name = f"generated_layer_{next(COUNTER)}"
            module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
            sys.modules[name] = module
            exec(compile(SOURCE, f"<{name}>", "exec"), module.__dict__)
            return module

        def test_it():
            layer = load_generated_module()
            assert layer.WEIGHTS.shape == (2048,)
            del sys.modules[layer.__name__]
        """,
        holder="sys.modules[[]'generated_layer_*'[]].WEIGHTS",
        diagnosis=("module the code made", "del sys.modules[name]"),
    ),
    # pytorch/pytorch#34257: pruning a pruned parameter again adds another method, with its own copy
    # of the mask, to the PruningContainer on the module's forward pre-hook; prune.remove() drops them
    Mechanism(
        name="pruning_a_pruned_parameter_again",
        kind="hooks",
        source="pytorch/pytorch#34257",
        leak="""
        import torch.nn.utils.prune as prune

        MODEL = torch.nn.Linear(256, 256)

        def test_prune_round():
            mask = (torch.rand_like(MODEL.weight) > 0.1).float()  # here
            prune.custom_from_mask(MODEL, "weight", mask)
            assert MODEL.weight.count_nonzero() > 0
        """,
        fixed="""
        import torch.nn.utils.prune as prune

        MODEL = torch.nn.Linear(256, 256)

        def test_prune_round():
            mask = (torch.rand_like(MODEL.weight) > 0.1).float()
            prune.custom_from_mask(MODEL, "weight", mask)
            prune.remove(MODEL, "weight")
            assert MODEL.weight.count_nonzero() > 0
        """,
        holder="*MODEL._forward_pre_hooks[[]*[]]._pruning_methods[[]*[]].mask",
        diagnosis=("PruningContainer", "prune.remove(module, name)"),
    ),
    # generative-computing/mellea#544: generate() outputs kept in a result's metadata still held
    # past_key_values, the KV cache of every layer, so each request kept its whole cache
    Mechanism(
        name="generate_output_kept_with_its_kv_cache",
        kind="outputs kept with their caches",
        source="generative-computing/mellea#544",
        leak="""
        import itertools
        from dataclasses import dataclass, field

        @dataclass
        class GenerateOutput:
            sequences: torch.Tensor
            past_key_values: tuple

        @dataclass
        class Result:
            text: str
            meta: dict = field(default_factory=dict)

        PROJ = torch.nn.Linear(64, 1024)
        RESULTS = {}
        REQUEST_IDS = itertools.count()

        @torch.no_grad()
        def generate(max_new_tokens=32):
            h, keys, values = torch.randn(1, 64), [], []
            for _ in range(max_new_tokens):
                k, v = PROJ(h).chunk(2, dim=-1)
                keys.append(k)
                values.append(v)
            past = ((torch.cat(keys), torch.cat(values)),) * 4  # here
            return GenerateOutput(torch.arange(max_new_tokens), past)

        def test_generate():
            output = generate()
            RESULTS[next(REQUEST_IDS)] = Result(str(output.sequences.tolist()), {"hf_output": output})
        """,
        fixed="""
        import itertools
        from dataclasses import dataclass, field

        @dataclass
        class GenerateOutput:
            sequences: torch.Tensor
            past_key_values: tuple

        @dataclass
        class Result:
            text: str
            meta: dict = field(default_factory=dict)

        PROJ = torch.nn.Linear(64, 1024)
        RESULTS = {}
        REQUEST_IDS = itertools.count()

        @torch.no_grad()
        def generate(max_new_tokens=32):
            h, keys, values = torch.randn(1, 64), [], []
            for _ in range(max_new_tokens):
                k, v = PROJ(h).chunk(2, dim=-1)
                keys.append(k)
                values.append(v)
            past = ((torch.cat(keys), torch.cat(values)),) * 4
            return GenerateOutput(torch.arange(max_new_tokens), past)

        def test_generate():
            output = generate()
            RESULTS[next(REQUEST_IDS)] = Result(str(output.sequences.tolist()))
        """,
        holder="*RESULTS[[]*[]].meta[[]'hf_output'[]].past_key_values[[]0[]][[]0[]]",
        diagnosis=("RESULTS[4].meta['hf_output'] holds", "remove it"),
    ),
    # pytorch/pytorch#2198 (pytorch/examples' repackage_hidden): a stateful LSTM carried its hidden
    # state to the next batch without detaching it, so every batch's graph stayed attached to it
    Mechanism(
        name="hidden_state_carried_without_detach",
        kind="autograd graphs kept",
        source="pytorch/pytorch#2198",
        leak="""
        class StatefulLM(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = torch.nn.LSTM(64, 128, batch_first=True)
                self.head = torch.nn.Linear(128, 64)
                self.hidden = None

            def forward(self, x):
                out, self.hidden = self.lstm(x, self.hidden)  # here
                return self.head(out)

        MODEL = StatefulLM()

        def test_next_chunk():
            assert MODEL(torch.randn(8, 16, 64)).shape == (8, 16, 64)
        """,
        fixed="""
        class StatefulLM(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = torch.nn.LSTM(64, 128, batch_first=True)
                self.head = torch.nn.Linear(128, 64)
                self.hidden = None

            def forward(self, x):
                out, hidden = self.lstm(x, self.hidden)
                self.hidden = tuple(h.detach() for h in hidden)
                return self.head(out)

        MODEL = StatefulLM()

        def test_next_chunk():
            assert MODEL(torch.randn(8, 16, 64)).shape == (8, 16, 64)
        """,
        holder="*MODEL.hidden[[]*[]]",
        diagnosis=("a hidden state", "self.hidden = h.detach()"),
    ),
    # pytorch/pytorch#7343: backward(create_graph=True) for a Hessian-vector product leaves each
    # parameter's .grad with a graph that refers back to the parameter: a cycle through C++
    Mechanism(
        name="create_graph_hessian_vector_product",
        kind="autograd graphs kept",
        source="pytorch/pytorch#7343",
        leak="""
        def hessian_vector_product(model, x, vector):
            loss = model(x).tanh().pow(2).sum()
            loss.backward(create_graph=True)
            grad_dot_v = sum((p.grad * v).sum() for p, v in zip(model.parameters(), vector))
            return torch.autograd.grad(grad_dot_v, list(model.parameters()))

        def test_hvp():
            model = torch.nn.Linear(128, 128)  # here
            vector = [torch.randn_like(p) for p in model.parameters()]
            assert hessian_vector_product(model, torch.randn(32, 128), vector)[0].shape == (128, 128)
        """,
        fixed="""
        def hessian_vector_product(model, x, vector):
            loss = model(x).tanh().pow(2).sum()
            grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
            grad_dot_v = sum((g * v).sum() for g, v in zip(grads, vector))
            return torch.autograd.grad(grad_dot_v, list(model.parameters()))

        def test_hvp():
            model = torch.nn.Linear(128, 128)
            vector = [torch.randn_like(p) for p in model.parameters()]
            assert hessian_vector_product(model, torch.randn(32, 128), vector)[0].shape == (128, 128)
        """,
        holder="<no Python reference: held from C++*",
        diagnosis=("create_graph=True", "torch.autograd.grad(loss, params, create_graph=True)"),
    ),
    Mechanism(
        name="current_one_held_beside_the_list_of_all",
        kind="class attributes",
        source="huggingface/accelerate#3391",
        leak="""
        from torch.utils.data import DataLoader, TensorDataset

        class GradientState:  # a Borg: every instance shares the class's dict
            _shared_state = {}

            def __init__(self):
                self.__dict__ = self._shared_state
                if not self._shared_state:
                    self.active_dataloader = None
                    self.dataloader_references = [None]

        class Shard(DataLoader):
            def __iter__(self):
                state = GradientState()
                state.active_dataloader = self
                state.dataloader_references.append(self)
                yield from super().__iter__()
                state.dataloader_references.remove(self)  # only where it was iterated to the end
                state.active_dataloader = state.dataloader_references[-1]

        def test_it():
            loader = Shard(TensorDataset(torch.ones(256, 256)), batch_size=32)  # here
            assert next(iter(loader))[0].shape == (32, 256)
        """,
        fixed="""
        import weakref

        from torch.utils.data import DataLoader, TensorDataset

        class GradientState:  # a Borg: every instance shares the class's dict
            _shared_state = {}

            def __init__(self):
                self.__dict__ = self._shared_state
                if not self._shared_state:
                    self.active_dataloader = None
                    self.dataloader_references = [None]

        class Shard(DataLoader):
            def __iter__(self):
                state = GradientState()
                state.active_dataloader = weakref.ref(self)
                state.dataloader_references.append(weakref.ref(self))
                yield from super().__iter__()

        def test_it():
            loader = Shard(TensorDataset(torch.ones(256, 256)), batch_size=32)
            assert next(iter(loader))[0].shape == (32, 256)
        """,
        # (the newest loader is also held as the active one, by the shorter path: what keeps them all
        # is named from the run before)
        holder="*GradientState._shared_state[[]'dataloader_references'[]][[]*[]].dataset.tensors[[]0[]] (an alike tensor run * left)",
        diagnosis=("_shared_state", "class attribute", "clear it"),
    ),
]


# What the plugin says today where it falls short, by entry and part.
GAPS: dict[str, dict[Part, str]] = {}


def _compiled_graphs_hold_module_buffers() -> bool:
    """Whether torch.compile's graphs keep a compiled module's buffers as constants of their own: torch
    2.4 does, 2.13 passes them in as inputs (the releases between are not tested)."""
    import torch

    return tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 13)


if _compiled_graphs_hold_module_buffers():
    # The graph dynamo installs as a module global (``test_leak.__compiled_fn_5``) is the nearest
    # holder of each kept model's buffer, and memory held through PyTorch's compile caches is set
    # aside (docs/limits.md): the user's own dict that keeps the models is not named.
    GAPS["cache_of_compiled_models"] = {
        part: "not caught on torch 2.4: 40.0 KiB held by caches PyTorch keeps itself (compiled graphs and their constants): not counted"
        for part in ("caught", "holder", "site", "diagnosis")
    }
