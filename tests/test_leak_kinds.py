"""End to end: each kind of leak fails its test with the holder named; each non-leak passes."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

from pytest_vramleak import diff, take_snapshot

from .conftest import read_report


def literal(pattern: str) -> str:
    """``pattern`` for fnmatch_lines with its brackets matched literally; ``*`` stays a wildcard."""
    return pattern.replace("[", "[[]")


LEAK_KINDS = {
    "module_global": (
        """
        CACHE = {}

        @pytest.mark.vram_budget
        def test_it():
            CACHE["user-42"] = torch.ones(1024, 256)  # here
        """,
        "held by test_it.CACHE['user-42']",
        None,
    ),
    "attribute_and_list_index": (
        """
        class Model:
            def __init__(self):
                self.history = []

        MODEL = Model()

        @pytest.mark.vram_budget
        def test_it():
            for step in range(4):
                MODEL.history.append(torch.ones(256))  # here
        """,
        "held by test_it.MODEL.history[*]",
        "a module-level container gained 4 entries and never let them go*",
    ),
    "class_attribute": (
        """
        class Registry:
            last = None

        @pytest.mark.vram_budget
        def test_it():
            Registry.last = torch.ones(512)  # here
        """,
        "held by test_it.Registry.last",
        "Registry.last is a class attribute, not an instance attribute: it lives as long as the class*",
    ),
    "tuple_index": (
        """
        PAIRS = []

        @pytest.mark.vram_budget
        def test_it():
            PAIRS.append((1, torch.ones(512)))  # here
        """,
        "held by test_it.PAIRS[*][1]",
        None,
    ),
    "closure_variable": (
        """
        def make_logger():
            seen = []
            def log(t):
                seen.append(t)
            return log

        LOG = make_logger()

        @pytest.mark.vram_budget
        def test_it():
            LOG(torch.ones(512))  # here
        """,
        "held by test_it.LOG -> closure var 'seen'[*]",
        "a closure (a callback, a logger) captured it and lives on*",
    ),
    "forward_hook": (
        """
        MODEL = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())

        @pytest.mark.vram_budget
        def test_it():
            outputs = []
            MODEL[0].register_forward_hook(lambda module, args, out: outputs.append(out.detach()))  # view
            with torch.no_grad():
                MODEL(torch.ones(4, 8))  # here: the output's storage is allocated in the forward pass
        """,
        "held by test_it.MODEL[0]._forward_hooks[*] -> closure var 'outputs'[*]",
        "a module hook keeps what it is given*handle.remove()*",
    ),
    "exception_traceback": (
        """
        ERRORS = []

        def forward():
            activations = torch.ones(1024)  # here
            raise RuntimeError("bad batch")

        @pytest.mark.vram_budget
        def test_it():
            try:
                forward()
            except RuntimeError as error:
                ERRORS.append(error)
        """,
        "held by test_it.ERRORS[*].__traceback__.tb_next.tb_frame (forward:*) local 'activations'",
        "a stored exception keeps its traceback*traceback.clear_frames*",
    ),
    "lru_cache": (
        """
        import functools

        @functools.lru_cache(maxsize=None)
        def embed(n):
            return torch.ones(n)  # here

        @pytest.mark.vram_budget
        def test_it():
            embed(1000)
        """,
        "held by test_it.embed -> lru_cache[1000]",
        "functools.lru_cache / functools.cache keeps every result*",
    ),
    "module_parameter_and_buffer_names": (
        """
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = torch.nn.ModuleList()

        NET = Net()

        @pytest.mark.vram_budget
        def test_it():
            block = torch.nn.Linear(16, 16)  # here
            block.register_buffer("scale", torch.ones(64))
            NET.blocks.append(block)
        """,
        "held by test_it.NET.blocks[*].weight",
        None,
    ),
    "parametrization_registered_again": (
        """
        from torch.nn.utils.parametrizations import spectral_norm

        NET = torch.nn.Sequential(torch.nn.Linear(4096, 8), torch.nn.ReLU())

        @pytest.mark.vram_budget
        def test_it():
            spectral_norm(NET[0])  # here
            with torch.no_grad():
                NET(torch.ones(2, 4096))
        """,
        "held by test_it.NET[0].parametrizations.weight[*]._v",
        "NET[0].parametrizations.weight holds one parametrization more each time one is registered on NET[0].weight*",
    ),
    "exception_given_a_tensor": (
        """
        ERRORS = []

        class BadBatch(Exception):
            def __init__(self, batch):
                super().__init__("non-finite loss")
                self.batch = batch

        @pytest.mark.vram_budget
        def test_it():
            try:
                raise BadBatch(torch.ones(1024))  # here
            except BadBatch as error:
                ERRORS.append(error)
        """,
        "held by test_it.ERRORS[*].batch",
        "a stored exception keeps the tensors it was given (ERRORS[*].batch)*",
    ),
    "buffer_per_length": (
        """
        import itertools

        class Rotary(torch.nn.Module):
            def forward(self, x):
                name = f"table_{x.shape[-1]}"
                if not hasattr(self, name):
                    self.register_buffer(name, torch.ones(x.shape[-1], 64))  # here
                return x * getattr(self, name)[:, 0]

        ROTARY = Rotary()
        LENGTHS = itertools.count(512)

        @pytest.mark.vram_budget
        def test_it():
            ROTARY(torch.ones(next(LENGTHS)))
        """,
        "held by test_it.ROTARY.table_*",
        "ROTARY.table_* is named from a number (*)*keep one, for the largest value, and slice it*",
    ),
    "distribution_kept_with_its_graph": (
        """
        from torch.distributions import Categorical

        POLICY = torch.nn.Linear(64, 32)
        DISTS = []

        @pytest.mark.vram_budget
        def test_it():
            dist = Categorical(logits=POLICY(torch.ones(16, 64)))  # here
            dist.sample()
            DISTS.append(dist)
        """,
        "held by test_it.DISTS[*].*",
        "DISTS[*] is a torch.distributions object, which keeps the parameters it was made from*",
    ),
    "tensor_written_into_with_a_graph": (
        """
        # dmlc/dgl#698, pytorch/pytorch#1111: a feature bank each step writes encoder outputs into
        ENCODER = torch.nn.Linear(64, 32)
        BANK = torch.zeros(4096, 32)
        STEP = iter(range(64))

        @pytest.mark.vram_budget
        def test_it():
            step = next(STEP)
            BANK[step * 64 : (step + 1) * 64] = ENCODER(torch.ones(64, 64))  # here
        """,
        "held by test_it.BANK",
        "BANK was written into with values that carry their autograd graph (its grad_fn is CopySlices*",
    ),
    "value_a_console_echoed": (
        """
        import code

        ENCODER = torch.nn.Linear(256, 256)

        def encode():
            return ENCODER(torch.ones(512, 256)).sum()  # here

        @pytest.mark.vram_budget
        def test_it():
            # A console (or a doctest) echoes the value of an expression: sys.displayhook keeps it in builtins._
            code.InteractiveInterpreter({"encode": encode}).runsource("encode()")
        """,
        "held by builtins._",
        "builtins._ is where sys.displayhook keeps the last value an interactive console or a doctest echoed*",
    ),
    "running_statistic_set_with_its_graph": (
        """
        # pytorch/pytorch#20275: a batch norm that sets its running mean from the batch's, autograd on
        class MeanOnlyBatchNorm(torch.nn.Module):
            def __init__(self, features):
                super().__init__()
                self.register_buffer("running_mean", torch.zeros(features))

            def forward(self, x):
                mean = x.mean(dim=0)
                self.running_mean = 0.9 * self.running_mean + 0.1 * mean
                return x - mean

        MODEL = torch.nn.Sequential(torch.nn.Linear(64, 256), MeanOnlyBatchNorm(256))

        @pytest.mark.vram_budget
        def test_it():
            MODEL(torch.ones(32, 64))  # here
        """,
        "held by test_it.MODEL[1].running_mean",
        "autograd graph kept alive: * behind MODEL[1].running_mean, a tensor that still has its grad_fn: a state "
        "set from a computation made with autograd on*self.running_mean = h.detach(), self.running_mean += x.detach()*",
    ),
    "last_traceback_of_a_console": (
        """
        import code

        def step():
            hidden = torch.ones(256, 256)  # here
            raise ValueError("bad batch")

        @pytest.mark.vram_budget
        def test_it():
            # An interactive console that prints an error keeps it in sys.last_traceback.
            code.InteractiveInterpreter({"step": step}).runsource("step()")
        """,
        "held by sys.last_*(step:*) local 'hidden'",
        "sys.last_traceback / sys.last_value keep the last reported error's frames and their local tensors*",
    ),
    "mkldnn_tensor": (
        """
        KEEP = {}

        @pytest.mark.vram_budget
        def test_it():
            KEEP["m"] = torch.randn(4096).to_mkldnn()  # here
        """,
        "held by test_it.KEEP['m']",
        None,
    ),
    "dlpack_capsule": (
        """
        KEEP = {}

        @pytest.mark.vram_budget
        def test_it():
            KEEP["capsule"] = torch.utils.dlpack.to_dlpack(torch.ones(1024))  # here
        """,
        "held by test_it.KEEP['capsule'] (a DLPack capsule of it)",
        None,
    ),
    "numpy_array_from_dlpack": (
        """
        import numpy
        KEEP = {}

        @pytest.mark.vram_budget
        def test_it():
            KEEP["array"] = numpy.from_dlpack(torch.ones(1024))  # here
        """,
        "held by test_it.KEEP['array'] (a numpy array sharing its memory)",
        None,
    ),
    "future_value": (
        """
        KEEP = {}

        @pytest.mark.vram_budget
        def test_it():
            future = torch.futures.Future()
            future.set_result(torch.ones(1024))  # here
            KEEP["future"] = future
        """,
        "held by test_it.KEEP['future'].value()",
        None,
    ),
    "state_in_a_dict_set_from_itself": (
        """
        W = torch.nn.Linear(64, 64)
        STATE = {"h": torch.zeros(32, 64)}

        @pytest.mark.vram_budget
        def test_it():
            STATE["h"] = torch.tanh(W(torch.ones(32, 64)) + STATE["h"])  # here
        """,
        "held by test_it.STATE['h']",
        "autograd graph kept alive: * behind STATE['h'], a tensor that still has its grad_fn, whose graph holds what "
        "other runs of the test computed: a value computed from its own last value*STATE['h'] = value.detach()*",
    ),
    "loss_stored_in_a_dict_each_run": (
        """
        import itertools

        W = torch.nn.Linear(64, 64)
        STEPS = itertools.count()
        LOSSES = {}

        @pytest.mark.vram_budget
        def test_it():
            LOSSES[f"step-{next(STEPS)}"] = W(torch.ones(32, 64)).relu().sum()  # here
        """,
        "held by test_it.LOSSES['step-*']",
        "autograd graph kept alive: * behind LOSSES['step-*'], a tensor that still has its grad_fn: a loss or an "
        "output stored as it was computed keeps the graph of the step that made it: store loss.item()*",
    ),
    "gradient_of_an_input": (
        """
        IMAGES = [torch.rand(3, 32, 32) for _ in range(4)]
        MODEL = torch.nn.Linear(3 * 32 * 32, 10)

        @pytest.mark.vram_budget
        def test_it():
            # An attack takes the gradient of the images a module keeps, and leaves it in their .grad.
            images = [image.requires_grad_() for image in IMAGES]
            MODEL(torch.stack(images).flatten(1)).sum().backward()  # here
            MODEL.zero_grad(set_to_none=True)
        """,
        "held by test_it.IMAGES[*].grad",
        "backward() wrote a gradient into IMAGES[*], a tensor that is no parameter on which requires_grad was set*"
        "set its .grad to None (and requires_grad_(False)) once read*",
    ),
    "generator_kept_unfinished": (
        """
        STREAMS = []

        def predictions(batches):
            for batch in batches:
                yield batch.argmax(-1)

        @pytest.mark.vram_budget
        def test_it():
            stream = predictions([torch.ones(256, 64) for _ in range(4)])  # here
            next(stream)
            STREAMS.append(stream)  # resumed later, or never
        """,
        "held by test_it.STREAMS[*] local 'batches'[*]",
        "an unfinished generator keeps the locals of its suspended frame (its inputs, what it computed last) for as "
        "long as it lives, here STREAMS[*]: run it to its end, close() it when done with it, or drop it",
    ),
    "autograd_graph": (
        """
        LOSSES = []

        @pytest.mark.vram_budget
        def test_it():
            weight = torch.randn(128, 128, requires_grad=True)
            for _ in range(3):
                batch = torch.randn(32, 128)
                LOSSES.append((batch @ weight).relu().sum())  # here
        """,
        "held by test_it.LOSSES[*]",
        "autograd graph kept alive: * in * saved tensors behind tensors that still have their grad_fn, kept in LOSSES "
        "(LOSSES[*], ...)*store loss.item() or tensor.detach() instead, and empty LOSSES when done",
    ),
}


@pytest.mark.parametrize("kind", sorted(LEAK_KINDS))
def test_leak_kind_fails_names_its_holder_site_and_cause(pytester: pytest.Pytester, kind: str) -> None:
    source, holder_line, diagnosis = LEAK_KINDS[kind]
    text = "import pytest, torch\n" + textwrap.dedent(source)
    site_line = next(number for number, line in enumerate(text.splitlines(), 1) if "# here" in line)
    view_line = next((number for number, line in enumerate(text.splitlines(), 1) if line.endswith("# view")), None)
    pytester.makepyfile(test_it=text)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rf", "--vramleak-sites=on")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "leaked * on cpu, allowed 0 B*",
            "leaked tensors*:",
            f"    allocated at test_it.py:{site_line} in *",
            f"*{literal(holder_line)}*",
        ]
    )
    if view_line is not None:  # the storage's allocation first, then where the kept view was made
        result.stdout.fnmatch_lines(
            [
                f"    allocated at test_it.py:{site_line} in *",
                f"        kept through a view made at test_it.py:{view_line} in *",
            ]
        )
    if diagnosis is not None:
        result.stdout.fnmatch_lines([f"    diagnosis: {literal(diagnosis)}"])
    result.stdout.fnmatch_lines(["LEAKED test_it.py::test_it - VramLeak: leaked * on cpu, allowed 0 B*"])


def test_parameter_and_buffer_named_with_module_path(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        NET = torch.nn.ModuleDict()

        @pytest.mark.vram_budget
        def test_it():
            block = torch.nn.BatchNorm1d(64)
            NET["norm"] = block
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*held by test_it.NET.norm.weight"])
    result.stdout.fnmatch_lines(["*held by test_it.NET.norm.running_mean"])


def test_autograd_graph_bytes_are_reported(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        LOSSES = []

        @pytest.mark.vram_budget
        def test_it():
            for _ in range(4):
                x = torch.randn(64, 256, requires_grad=True)
                LOSSES.append((x * 2).exp().sum())
        """
    )
    result, report = run_checked()
    (group,) = report["test_it"]["tensors"]
    assert group["held_by"][0].startswith("test_it.LOSSES[")
    # each step keeps x and exp's output (64 KiB each) and the scalar 2 (8 bytes) alive through its graph
    assert group["graph_bytes"] == 4 * (2 * 64 * 256 * 4 + 8)
    result.stdout.fnmatch_lines(["*diagnosis: autograd graph kept alive: 512.0 KiB in 12 saved tensors*"])


ROWS = [[1.0] * 256] * 256


def compile_with_a_constant() -> None:
    # AOT autograd turns torch.tensor(...) inside a compiled function into a constant of the graph.
    @torch.compile(backend="aot_eager")
    def project(x: torch.Tensor) -> torch.Tensor:
        return x @ torch.tensor(ROWS)

    project(torch.ones(4, 256))


def test_compiled_graph_constants_are_named_as_pytorchs_cache() -> None:
    before = take_snapshot("cpu")
    try:
        compile_with_a_constant()
        leak = diff(before)
        (group,) = leak.groups
        assert group.bytes == 256 * 256 * 4
        assert ".__compiled_fn_" in group.held_by[0]  # torch.compile's global in this module
        assert group.diagnoses == [
            "held by a cache PyTorch keeps itself (a torch.compile graph and its constants): not the test's leak, "
            "and not counted as one"
        ]
    finally:
        torch._dynamo.reset()
    assert diff(before).leaked_bytes == 0


def test_constants_of_an_inductor_graph_are_not_the_tests_leak(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inductor keeps a compiled graph's constants as globals of its generated module, which
    # torch._dynamo.reset() does not free: a cache of PyTorch's all the same.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(pytester.path / "inductor-cache"))
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        KEPT = []

        def convolve(x):
            kernel = torch.tensor([[1.0, 2.0, 1.0]])  # a constant of the compiled graph
            return torch.nn.functional.conv1d(x, kernel.view(1, 1, 3))

        @pytest.mark.vram_budget
        def test_compiled():
            torch.compile(convolve, backend="inductor")(torch.ones(1, 1, 8))

        @pytest.mark.vram_budget
        def test_compiled_and_leaks():
            KEPT.append(torch.compile(convolve, backend="inductor")(torch.ones(1, 1, 8)))
        """
    )
    # Warnings are errors, as the plugin must emit none (reading a fake tensor's data pointer
    # warns); torch's own deprecation warnings while compiling are left alone. In a process of its
    # own: what inductor imports cannot be imported twice in one process.
    path = pytester.path / "vramleak.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        f"--vramleak-report={path}",
        "-W",
        "error",
        "-W",
        "ignore::DeprecationWarning",
    )
    report = read_report(path)
    assert report["test_compiled"]["verdict"] == "passed", result.stdout.str()
    assert report["test_compiled"]["leaked_bytes"] == 0
    assert any("held by caches PyTorch keeps itself" in note for note in report["test_compiled"]["notes"])
    leaked = report["test_compiled_and_leaks"]
    assert (leaked["verdict"], leaked["leaked_bytes"]) == ("leaked", 6 * 4)  # the output, not the constant
    assert [[re.sub(r"\[\d+\]", "[i]", chain) for chain in group["held_by"]] for group in leaked["tensors"]] == [
        ["test_it.KEPT[i]"]
    ]


def test_compiled_code_in_checked_tests_is_not_blamed_slowed_or_warned_about(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch
        from torch._dynamo.utils import counters

        torch._dynamo.config.error_on_recompile = True
        ROWS = [[1.0] * 256] * 256

        @torch.compile(backend="aot_eager")
        def project(x):
            return torch.relu(x @ torch.tensor(ROWS)) + 1

        @pytest.mark.vram_budget
        @pytest.mark.parametrize("n", range(3))
        def test_compiled(n):
            project(torch.ones(4, 256))

        def test_unchecked():  # the same mode stack as in checked tests: no recompilation
            project(torch.ones(4, 256))

        def test_compiled_steps(vramleak):
            # the recorder stops recording after the first measured steps, without leaving the
            # torch function mode stack that compiled code is guarded on
            for step in vramleak.steps(8):
                project(torch.ones(4, 256))

        def test_no_graph_breaks():
            assert not counters["graph_break"]
        """
    )
    modes_before = torch.overrides._get_current_function_mode_stack()
    try:
        result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "-W", "error")
    finally:
        torch._dynamo.reset()
        torch._dynamo.config.error_on_recompile = False
    result.assert_outcomes(passed=6)
    assert torch.overrides._get_current_function_mode_stack() == modes_before  # nothing left behind the session


def test_a_fake_tensor_beside_a_leak_is_named_without_a_warning(pytester: pytest.Pytester) -> None:
    # torch.compile's caches keep fake tensors (e3nn's tests keep them by the hundred): they say
    # they are on the CPU, and reading their data pointer warns, once a process (so a process of its own)
    pytester.makepyfile(
        test_it="""
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        KEPT = []

        def test_keeps_a_fake_tensor_and_a_real_one():
            with FakeTensorMode():
                KEPT.append(torch.ones(4))
            KEPT.append(torch.ones(256))
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["    held by test_it.KEPT[[]*[]]"])
    result.stdout.no_fnmatch_line("*Warning*")
    result.stdout.no_fnmatch_line("*warnings summary*")


def test_a_failed_tests_frames_are_freed_before_the_next_checked_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import gc, pytest, torch

        def test_fails_holding_activations():
            activations = torch.ones(1024, 1024)
            assert activations.sum() < 0

        @pytest.mark.vram_budget
        def test_next():
            # pytest kept the failed test's traceback in sys.last_traceback until this test began
            assert not [o for o in gc.get_objects() if type(o) is torch.Tensor and o.numel() == 1024 * 1024]
        """
    )
    # In a process of its own: an inline run's recorder would keep the failed test's report too.
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly").assert_outcomes(passed=1, failed=1)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:vramleak").assert_outcomes(
        failed=2
    )


@pytest.mark.parametrize("sites", ["auto", "on"])
def test_compiled_recurrent_networks_run_as_without_the_plugin(pytester: pytest.Pytester, sites: str) -> None:
    # Compiling nn.LSTM's forward failed ("zeros(): argument 'dtype' must be torch.dtype, not int")
    # while a torch function mode was on the stack, as the plugin's old site recorder was.
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        LSTM = torch.nn.LSTM(8, 8, batch_first=True)
        GRU = torch.nn.GRU(8, 8, batch_first=True)

        @torch.compile(backend="eager")
        def run_lstm(x):
            out, _ = LSTM(x)
            return out.sum()

        @torch.compile(backend="eager")
        def run_gru(x):
            out, _ = GRU(x)
            return out.sum()

        @pytest.mark.vram_budget
        def test_checked_lstm():
            run_lstm(torch.ones(2, 4, 8)).backward()
            LSTM.zero_grad(set_to_none=True)  # the gradients would stay with the module otherwise

        @pytest.mark.vram_budget
        def test_checked_gru():
            with torch.no_grad():
                run_gru(torch.ones(2, 4, 8))

        def test_unchecked():
            run_lstm(torch.ones(2, 4, 8))
            run_gru(torch.ones(2, 4, 8))

        def test_steps(vramleak):
            for step in vramleak.steps(6):
                run_lstm(torch.ones(2, 4, 8)).backward()
            LSTM.zero_grad(set_to_none=True)
        """
    )
    # In a process of its own: what compiling imports cannot be imported twice in one process.
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", f"--vramleak-sites={sites}"
    )
    result.assert_outcomes(passed=4)
    result.stdout.no_fnmatch_line("*pytest_vramleak*")


USER_ERRORS_AND_WARNINGS = """
import pytest, torch

@pytest.mark.vram_budget
def test_torch_error():
    torch.ones(2, 3) @ torch.ones(4, 5)

def test_torch_error_in_steps(vramleak):
    for step in vramleak.steps(6):
        if step == 4:
            torch.ones(2, 3) @ torch.ones(4, 5)

@pytest.mark.vram_budget
def test_warning_from_cpp():
    # torch warns from C++ about resizing a non-empty out= tensor
    torch.add(torch.ones(2), torch.ones(2), out=torch.ones(3))

def test_warning_from_cpp_in_steps(vramleak):
    for step in vramleak.steps(6):
        torch.add(torch.ones(2), torch.ones(2), out=torch.ones(3))
"""


@pytest.mark.parametrize("sites", ["auto", "on"])
def test_errors_and_warnings_look_as_without_the_plugin(pytester: pytest.Pytester, sites: str) -> None:
    pytester.makepyfile(test_it=USER_ERRORS_AND_WARNINGS)
    pytester.makeconftest(
        """
        import pytest

        class StandIn:  # the run without the plugin: the same steps, unchecked
            @pytest.fixture
            def vramleak(self):
                return type("Steps", (), {"steps": lambda self, n, warmup=2: range(n)})()

        def pytest_configure(config):
            if not config.pluginmanager.hasplugin("vramleak"):
                config.pluginmanager.register(StandIn(), "stand-in")
        """
    )
    # A filter on the warning's module: it must name the test's module, as without the plugin.
    pytester.makeini("[pytest]\nfilterwarnings =\n    error::UserWarning:test_it\n")
    arguments = ("-p", "no:cacheprovider", "-p", "no:randomly", "--tb=line", "-W", "ignore::DeprecationWarning")
    plain = pytester.runpytest(*arguments, "-p", "no:vramleak")
    checked = pytester.runpytest(*arguments, "--vramleak", f"--vramleak-sites={sites}")
    assert checked.parseoutcomes() == plain.parseoutcomes() == {"failed": 4}

    def failure_lines(result: pytest.RunResult) -> list[str]:
        return sorted(line for line in result.stdout.lines if line.startswith(str(pytester.path)))

    assert failure_lines(checked) == failure_lines(plain)
    assert len(failure_lines(plain)) == 4
    long = pytester.runpytest(*arguments[:-2], "--tb=long", "--vramleak", f"--vramleak-sites={sites}")
    long.stdout.no_fnmatch_line("*pytest_vramleak/*.py:*")  # no frame of the plugin's in any traceback


def test_values_pytest_keeps_are_named_as_the_user_wrote_them(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch

        class Metric:
            def __init__(self):
                self._computed = None

            def compute(self):
                if self._computed is None:  # cached on first use, as torchmetrics does
                    self._computed = torch.ones(2, 8)
                return self._computed

        @pytest.fixture(scope="module")
        def model():
            return torch.nn.Linear(8, 8)

        @pytest.mark.vram_budget
        @pytest.mark.parametrize("metric", [Metric()])
        def test_metric(metric):
            metric.compute()

        @pytest.mark.vram_budget
        def test_backward(model):
            model(torch.ones(2, 8)).sum().backward()

        def test_later(model):  # keeps the module's model alive after test_backward
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*held by parametrize value metric of test_metric[[]metric0[]]._computed",
            "*diagnosis: an object pytest keeps as a parametrize value for the whole session kept what the test computed on it (a metric's cached compute() result)*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*held by fixture 'model' (module scope).weight.grad",
            "*diagnosis: backward() gave the model that fixture 'model' (module scope) keeps for many tests its gradients*",
        ]
    )
    result.stdout.no_fnmatch_line("*local 'item'*")
    result.stdout.no_fnmatch_line("*_fixture_defs*")


HELD_WITHOUT_A_TENSOR_IN_PYTHON = {
    "an_autograd_node": (
        """
        NODES = []

        @pytest.mark.vram_budget
        def test_it():
            x = torch.randn(64, 64, requires_grad=True)
            NODES.append((x * 2).exp().sum().grad_fn)
        """,
        "held by test_it.NODES[[]*] -> autograd graph of SumBackward0",
        "an autograd node (a grad_fn) was kept, not a tensor*",
    ),
    "a_numpy_array_over_a_tensor": (
        """
        ARRAYS = []

        @pytest.mark.vram_budget
        def test_it():
            ARRAYS.append(torch.ones(1024).numpy())
        """,
        "held by test_it.ARRAYS[[]*].base",
        "a numpy array made by tensor.numpy() shares the tensor's memory*",
    ),
    "a_scripted_module": (
        """
        SCRIPTED = []

        class Shift(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("offset", torch.ones(256))

            def forward(self, x):
                return x + self.offset

        @pytest.mark.vram_budget
        def test_it():
            SCRIPTED.append(torch.jit.script(Shift()))
        """,
        "held by test_it.SCRIPTED[[]*]*offset",
        None,
    ),
}


@pytest.mark.parametrize("kind", sorted(HELD_WITHOUT_A_TENSOR_IN_PYTHON))
def test_held_from_cpp_only_when_nothing_in_python_holds_it(pytester: pytest.Pytester, kind: str) -> None:
    source, holder, diagnosis = HELD_WITHOUT_A_TENSOR_IN_PYTHON[kind]
    pytester.makepyfile(test_it="import pytest, torch\n" + textwrap.dedent(source))
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"    {holder}"])
    if diagnosis:
        result.stdout.fnmatch_lines([f"    diagnosis: {diagnosis}"])
    result.stdout.no_fnmatch_line("*held from C++*")


HELD_WITHOUT_A_TENSOR_IN_PYTHON_UNMARKED = {
    **HELD_WITHOUT_A_TENSOR_IN_PYTHON,
    # the tensor a helper made and returned (the run recording sites notes what user functions return)
    "a_numpy_array_over_a_tensor_a_helper_made": (
        """
        ARRAYS = []

        def make_batch():
            return torch.ones(1024)

        def test_it():
            ARRAYS.append(make_batch().numpy())
        """,
        "held by test_it.ARRAYS[[]*].base",
        None,
    ),
    # beside a tensor a list holds: the run recording sites notes what functions return, and torch
    # keeps the Python storage object that made for the array's tensor (a storage nothing holds)
    "a_numpy_array_beside_a_tensor_a_list_keeps": (
        """
        ARRAYS = []
        KEPT = []

        def make_batch():
            return torch.ones(1024)

        def test_it():
            ARRAYS.append(make_batch().numpy())
            KEPT.append(torch.zeros(8))
        """,
        "held by test_it.ARRAYS[[]*].base",
        None,
    ),
}


@pytest.mark.parametrize("kind", sorted(HELD_WITHOUT_A_TENSOR_IN_PYTHON_UNMARKED))
def test_what_nothing_in_python_holds_is_named_and_placed_under_the_default_rule(
    pytester: pytest.Pytester, kind: str
) -> None:
    # Unmarked, under --vramleak: confirmed by running again, then once more recording where the
    # tensors are made (with fewer frames, and no notes of what functions return, where no Python
    # object refers to them).
    source, holder, _ = HELD_WITHOUT_A_TENSOR_IN_PYTHON_UNMARKED[kind]
    pytester.makepyfile(
        test_it="import pytest, torch\n" + textwrap.dedent(source).replace("@pytest.mark.vram_budget\n", "")
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "-W", "ignore::DeprecationWarning")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["memory grew * per run of the test*", "    allocated at test_it.py:* in *", f"    {holder}"]
    )
    result.stdout.no_fnmatch_line("*held from C++*")
    result.stdout.no_fnmatch_line("*held by PyTorch itself*")


NUMPY_KINDS = [
    kind for kind, (_, holder, _) in HELD_WITHOUT_A_TENSOR_IN_PYTHON_UNMARKED.items() if holder.endswith(".base")
]


@pytest.mark.parametrize("heap_size", ["big heap"], indirect=True)
@pytest.mark.parametrize("kind", NUMPY_KINDS)
def test_a_numpy_array_over_a_tensor_is_named_the_same_in_a_process_that_holds_much(
    pytester: pytest.Pytester, kind: str, heap_size: str
) -> None:
    # as in a worker that ran many test modules before: the array is named through its base, not
    # set aside as held from C++ nor named by the memory it shares
    source, holder, _ = HELD_WITHOUT_A_TENSOR_IN_PYTHON_UNMARKED[kind]
    pytester.makepyfile(test_it="import pytest, torch\n" + textwrap.dedent(source))
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "-W", "ignore::DeprecationWarning")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"    {holder}"])
    result.stdout.no_fnmatch_line("*sharing its memory*")
    result.stdout.no_fnmatch_line("*held from C++*")


def test_a_registry_a_c_module_shares_is_named_by_its_python_owner_and_a_class_key_by_its_name(
    pytester: pytest.Pytester,
) -> None:
    # copyreg.dispatch_table is also held by the _pickle C module's state, one level nearer
    pytester.makepyfile(
        test_it="""
        import copyreg
        import torch

        class Reducible:
            pass

        def test_registers_a_reducer():
            kept = torch.ones(1024)
            copyreg.pickle(Reducible, lambda obj: (Reducible, (), kept))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["    held by copyreg.dispatch_table[[]Reducible[]] -> closure var 'kept'"])
    result.stdout.no_fnmatch_line("*_pickle*")
    result.stdout.no_fnmatch_line("*type key*")


def test_a_tensors_hook_is_named_through_its_hooks_dict(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import torch

        PARAM = torch.nn.Parameter(torch.ones(4))

        def test_hooks_a_parameter():
            big = torch.ones(4096)
            PARAM.register_hook(lambda grad: grad + big.sum())
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramleak", "--vramleak-fail-on=any")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "    held by test_it.PARAM._backward_hooks[[]*[]] -> closure var 'big'",
            "    diagnosis: a tensor's hook (register_hook) keeps what it is given*handle.remove()*",
        ]
    )
    result.stdout.no_fnmatch_line("*<Parameter>*")


def test_fake_tensors_and_their_autograd_nodes_are_torch_compiles_not_a_leak(pytester: pytest.Pytester) -> None:
    # torch.compile traces with fake tensors and its caches keep them, autograd nodes included
    # (torch_geometric's compiled convolutions): they hold no memory, and reading their data
    # pointer warns; neither a history leak nor a warning.
    pytester.makepyfile(
        test_it="""
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        KEPT = []
        with FakeTensorMode():  # its lazy imports, done before tests are traced
            (torch.empty(2, 2, requires_grad=True).relu() @ torch.empty(2, 2)).tanh().sum()

        def test_fake_graph_kept():
            with FakeTensorMode():
                w = torch.empty(64, 64, requires_grad=True)
                KEPT.append((w.relu() @ w.t()).tanh().sum())
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--vramleak", "--vramleak-sites=on", "-W", "error")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*warning*")


def test_a_kept_mkldnn_model_is_named_through_its_torchscript_attributes(pytester: pytest.Pytester) -> None:
    # to_mkldnn(model) returns a TorchScript module: its buffers live in C++, where gc sees no
    # reference; the module's attributes and their autograd graphs (the dense weight behind
    # weight.to_mkldnn()) are read to name them.
    pytester.makepyfile(
        test_it="""
        import pytest, torch, torch.utils.mkldnn
        KEEP = {}

        @pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")  # torch.jit.script_method
        @pytest.mark.vram_budget
        def test_it():
            KEEP["mkldnn_model"] = torch.utils.mkldnn.to_mkldnn(torch.nn.Linear(64, 64))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["float32[[]64, 64[]] on cpu: * 16.0 KiB", "    held by test_it.KEEP[[]'mkldnn_model'[]].weight"]
    )
    result.stdout.fnmatch_lines(["float32[[]64[]] on cpu: *", "    held by test_it.KEEP[[]'mkldnn_model'[]].bias"])
    result.stdout.no_fnmatch_line("*held from C++*")


def test_numpy_arrays_next_to_a_kept_mkldnn_model_are_not_named_its_holders(pytester: pytest.Pytester) -> None:
    # An mkldnn tensor exposes no data pointer: it stands for its memory by its TensorImpl's
    # address. Small numpy arrays allocated next to that object in the process's heap do not
    # share its memory.
    pytester.makepyfile(
        test_it="""
        import numpy, pytest, torch, torch.utils.mkldnn
        KEEP = {}
        ARRAYS = []

        @pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")  # torch.jit.script_method
        @pytest.mark.vram_budget
        def test_it():
            KEEP["mkldnn_model"] = torch.utils.mkldnn.to_mkldnn(torch.nn.Linear(64, 64))
            ARRAYS.extend(numpy.zeros(8) for _ in range(2000))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["float32[[]64, 64[]] on cpu: * 16.0 KiB", "    held by test_it.KEEP[[]'mkldnn_model'[]].weight"]
    )
    result.stdout.no_fnmatch_line("*numpy array*")
    result.stdout.no_fnmatch_line("*ARRAYS*")


ATEXIT_LEAK = """
import atexit
import torch

def log_at_exit(value):
    atexit.register(lambda: print(float(value.sum())))

def test_registers_a_closure_over_a_tensor():
    log_at_exit(torch.ones(4096))

def test_registers_a_number():
    number = float(torch.ones(4096).sum())
    callback = lambda: print(number)
    atexit.register(callback)
    atexit.unregister(callback)
    kept = torch.ones(4096)
    atexit.register(print, "done")
"""


def test_a_callback_registered_with_atexit_is_named(pytester: pytest.Pytester) -> None:
    # CPython keeps atexit's callbacks outside gc: without the note the plugin makes of each one
    # registered while a check runs, the holder read "<function held outside Python's gc>"
    pytester.makepyfile(test_it=ATEXIT_LEAK)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "LEAKED test_it.py::test_registers_a_closure_over_a_tensor*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "    held by atexit callback log_at_exit.<locals>.<lambda> -> closure var 'value'",
            "    diagnosis: atexit keeps every callback registered with it*",
        ]
    )
