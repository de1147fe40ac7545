"""End to end: the vramleak fixture flags memory that grows across steps, and nothing else."""

from __future__ import annotations

import textwrap

import pytest

TRAINING = """
import collections
import pytest, torch

def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))

def batch():
    return torch.randn(32, 64), torch.randn(32, 1)
"""

NOT_LEAKS = {
    "adam_state_created_in_warmup": """
        def test_it(vramleak):
            model = make_model()
            optimizer = torch.optim.Adam(model.parameters())
            for step in vramleak.steps(8, warmup=2):
                x, y = batch()
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
    """,
    "bounded_buffer_that_plateaus": """
        def test_it(vramleak):
            recent = collections.deque(maxlen=3)
            for step in vramleak.steps(12, warmup=2):
                recent.append(torch.ones(1024))
    """,
    "gradient_accumulation": """
        def test_it(vramleak):
            model = make_model()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in vramleak.steps(12, warmup=2):
                x, y = batch()
                (torch.nn.functional.mse_loss(model(x), y) / 4).backward()
                if step % 4 == 3:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
    """,
    "logging_loss_item": """
        def test_it(vramleak):
            model = make_model()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            losses = []
            for step in vramleak.steps(10):
                x, y = batch()
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
    """,
    "autocast": """
        def test_it(vramleak):
            model = make_model()
            for step in vramleak.steps(8):
                x, _ = batch()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = model(x)
                out.float().sum().backward()
    """,
    "large_temporaries_freed_each_step": """
        def test_it(vramleak):
            for step in vramleak.steps(8):
                scratch = torch.empty(4 * 1024 * 1024)
                scratch.fill_(step)
                del scratch
    """,
    "inference_under_no_grad": """
        def test_it(vramleak):
            model = make_model().eval()
            predictions = []
            with torch.no_grad():
                vramleak.check(lambda step: predictions.append(model(batch()[0]).sum().item()), steps=8)
    """,
}

LEAKS = {
    "loss_accumulated_with_graph": (
        """
        def test_it(vramleak):
            model = make_model()
            total = 0
            for step in vramleak.steps(8):
                x, y = batch()
                total = total + torch.nn.functional.mse_loss(model(x), y)
        """,
        ["*test_it:* local 'total'", "*diagnosis: autograd graph kept alive*"],
    ),
    "steady_growth": (
        """
        def test_it(vramleak):
            history = []
            for step in vramleak.steps(8):
                history.append(torch.ones(1024))
        """,
        [
            "memory grew 4.0 KiB per step over 6 measured steps (24.0 KiB in total) on cpu, tolerance 0 B",
            "*test_it:* local 'history'[[]*]",
        ],
    ),
    "growth_every_other_step": (
        """
        def test_it(vramleak):
            history = []
            for step in vramleak.steps(10):
                if step % 2:
                    history.append(torch.ones(1024))
        """,
        ["memory grew * per step over 8 measured steps*", "*test_it:* local 'history'[[]*]"],
    ),
    "hook_appending_outputs_through_check": (
        """
        MODEL = make_model()
        SEEN = []
        MODEL[0].register_forward_hook(lambda module, args, out: SEEN.append(out.detach()))

        def test_it(vramleak):
            with torch.no_grad():
                vramleak.check(lambda step: MODEL(batch()[0]), steps=6)
        """,
        ["memory grew * per step over 4 measured steps*", "*held by test_it.SEEN[[]*]"],
    ),
}


@pytest.mark.parametrize("kind", sorted(NOT_LEAKS))
def test_non_leak_passes(pytester: pytest.Pytester, kind: str) -> None:
    pytester.makepyfile(test_it=TRAINING + textwrap.dedent(NOT_LEAKS[kind]))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("kind", sorted(LEAKS))
def test_leak_fails_with_holder(pytester: pytest.Pytester, kind: str) -> None:
    source, lines = LEAKS[kind]
    pytester.makepyfile(test_it=TRAINING + textwrap.dedent(source))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([*lines, "FAILED test_it.py::test_it - VramLeak: memory grew *"])


def test_step_figures_in_json(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import torch

        def test_grows(vramleak):
            kept = []
            for step in vramleak.steps(6, warmup=1):
                kept.append(torch.ones(256))

        def test_flat(vramleak):
            for step in vramleak.steps(4):
                torch.ones(256)
        """
    )
    result, report = run_checked()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["largest leaks:", "     5.0 KiB  test_it.py::test_grows (cpu, grew across steps)"])
    assert report["test_grows"]["verdict"] == "leaked"
    assert report["test_grows"]["steps"] == [1024, 2048, 3072, 4096, 5120]
    assert report["test_grows"]["growth_bytes"] == 5120
    assert report["test_flat"]["verdict"] == "passed"
    assert report["test_flat"]["steps"] == [0, 0]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("vramleak.steps(3, warmup=2)", "vramleak.steps(3, warmup=2) leaves 1 measured step(s); at least 2 are needed"),
        ("vramleak.steps(4, warmup=-1)", "vramleak.steps(n, warmup=k) takes whole numbers, got n=4, warmup=-1"),
        ("vramleak.steps(4.5)", "vramleak.steps(n, warmup=k) takes whole numbers, got n=4.5, warmup=2"),
        (
            "vramleak.check(print, steps=1)",
            "vramleak.steps(1, warmup=2) leaves 0 measured step(s); at least 2 are needed",
        ),
        ("vramleak.steps(True)", "vramleak.steps(n, warmup=k) takes whole numbers, got n=True, warmup=2"),
    ],
)
def test_bad_step_arguments_are_clear_errors(pytester: pytest.Pytester, call: str, message: str) -> None:
    pytester.makepyfile(
        test_it=f"""
        def test_it(vramleak):
            for step in {call} or ():
                pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [message.replace("[", "[[]").replace("(", "[(]"), f"FAILED test_it.py::test_it - Failed: {message[:20]}*"]
    )
    result.stdout.no_fnmatch_line("*pytest_vramleak*")


def test_steps_take_integers_of_any_type(pytester: pytest.Pytester) -> None:
    # numpy's integers and 0-d integer tensors (a config value, a loaded step count) count as ints
    pytester.makepyfile(
        test_it="""
        import numpy, torch

        def test_numpy(vramleak):
            ran = [step for step in vramleak.steps(numpy.int64(5), warmup=numpy.int32(1))]
            assert ran == [0, 1, 2, 3, 4] and type(ran[0]) is int
            assert len(vramleak.results[-1].steps) == 4

        def test_tensor(vramleak):
            assert vramleak.check(lambda: None, steps=torch.tensor(4), warmup=torch.tensor(1)).steps == [0, 0, 0]
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_warmup_and_tolerance_from_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nvramleak_warmup = 4\nvramleak_tolerance = 8 KiB\n")
    pytester.makepyfile(
        test_it="""
        import torch

        def test_small_growth_tolerated(vramleak):
            kept = []
            for step in vramleak.steps(10):
                kept.append(torch.ones(256))  # 1 KiB a step, 3 KiB across the halves
            assert vramleak.results[-1].warmup == 4
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


LEFT_EARLY = {
    "break": """
        def test_it(vramleak):
            kept = []
            for step in vramleak.steps(10):
                kept.append(torch.ones(256))
                if step == 6:
                    break
    """,
    "return": """
        def test_it(vramleak):
            kept = []
            for step in vramleak.steps(10):
                kept.append(torch.ones(256))
                if step == 6:
                    return
    """,
    "exception_caught_by_the_test": """
        def test_it(vramleak):
            kept = []
            try:
                for step in vramleak.steps(10):
                    kept.append(torch.ones(256))
                    if step == 6:
                        raise ValueError("diverged")
            except ValueError:
                pass
    """,
}


@pytest.mark.parametrize("how", sorted(LEFT_EARLY))
def test_a_loop_left_early_is_judged_on_the_steps_it_measured(pytester: pytest.Pytester, run_checked, how: str) -> None:
    pytester.makepyfile(test_it=TRAINING + textwrap.dedent(LEFT_EARLY[how]))
    result, report = run_checked()
    result.assert_outcomes(failed=1)  # the body passed; the growth fails the test, once
    result.stdout.fnmatch_lines(
        ["memory grew 1.0 KiB per step over 4 measured steps * (the loop was left early: 4 of 8 steps measured)"]
    )
    assert report["test_it"]["verdict"] == "leaked"
    assert report["test_it"]["steps"] == [1024 * n for n in range(1, 5)]


def test_a_loop_left_before_two_steps_were_measured_is_unchecked(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import torch

        def test_it(vramleak):
            for step in vramleak.steps(10):
                if step == 2:
                    break
        """
    )
    result, report = run_checked()
    result.assert_outcomes(passed=1)
    assert report["test_it"]["verdict"] == "unchecked"
    assert (
        report["test_it"]["reason"]
        == "not checked: the loop was left early, with 0 of 8 steps measured (at least 2 are needed)"
    )


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (
            "generator_step",
            "vramleak.check() was given generator_step, which returns a generator or coroutine without running its body*",
        ),
        (
            "lambda i: generator_step(i)",
            "vramleak.check() was given test_it.<locals>.<lambda>, which returns a generator or coroutine*",
        ),
        ("coroutine_step", "vramleak.check() was given coroutine_step, which returns a generator or coroutine*"),
        ("two_arguments", "vramleak.check() calls step(i) or step(), and two_arguments(a, b) takes neither"),
    ],
)
def test_check_refuses_a_step_that_would_not_run(pytester: pytest.Pytester, step: str, message: str) -> None:
    pytester.makepyfile(
        test_it=f"""
        import torch

        def generator_step(i):
            torch.ones(256)
            yield

        async def coroutine_step(i):
            torch.ones(256)

        def two_arguments(a, b):
            pass

        def test_it(vramleak):
            vramleak.check({step}, steps=6)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([message.replace("(", "[(]").replace(")", "[)]")])
    result.stdout.no_fnmatch_line("*pytest_vramleak*")


def test_check_takes_a_step_without_a_parameter(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import torch
        KEPT = []

        def test_clean(vramleak):
            assert not vramleak.check(lambda: torch.ones(256).sum(), steps=6).grows

        def test_leaks(vramleak):
            vramleak.check(lambda: KEPT.append(torch.ones(256)), steps=6)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_it.py::test_leaks - VramLeak: memory grew 1.0 KiB per step*"])


def test_a_bad_step_count_is_said_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        def test_it(vramleak):
            for step in vramleak.steps(0):
                pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["vramleak.steps(0, warmup=2) leaves 0 measured step(s); at least 2 are needed", "*short test summary*"]
    )
    failure_section = result.stdout.str().split("short test summary")[0]
    assert failure_section.count("leaves 0 measured step(s); at least 2 are needed") == 1
    result.stdout.no_fnmatch_line("*During handling of the above exception*")


def test_memory_that_settles_inside_the_window_passes_and_is_reported(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import collections, torch

        def test_it(vramleak):
            recent = collections.deque(maxlen=6)  # full at step 5
            for step in vramleak.steps(10):
                recent.append(torch.ones(1024))
        """
    )
    result, report = run_checked()
    result.assert_outcomes(passed=1)
    assert report["test_it"]["verdict"] == "passed"
    assert report["test_it"]["settled_after_step"] == 5
    result.stdout.fnmatch_lines(
        [
            "*= vramleak summary =*",
            "test_it.py::test_it: memory rose by 16.0 KiB during the measured steps and stayed flat after step 5 "
            "(settled: not a leak); warmup=6 would leave it out of the measured steps",
        ]
    )


def test_the_tensor_that_grows_is_named_not_the_steps_temporaries(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import torch

        def test_it(vramleak):
            everything = torch.empty(0, 8)
            for step in vramleak.steps(8):
                batch = torch.ones(4, 8)
                loss = batch.sum()
                everything = torch.cat([everything, batch])
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "no tensor made after warm-up outlived its step: one is replaced each step by a bigger one (torch.cat onto itself*",
            "float32[[]32, 8] on cpu: 1 tensor, 1.0 KiB",
            "    held by test_it:* local 'everything'",
        ]
    )
    result.stdout.no_fnmatch_line("*local 'batch'*")
    result.stdout.no_fnmatch_line("*local 'loss'*")


def test_a_hidden_state_carried_with_its_graph_is_diagnosed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import torch

        def test_it(vramleak):
            rnn = torch.nn.RNN(8, 8)
            hidden = torch.zeros(1, 1, 8)
            for step in vramleak.steps(8):
                out, hidden = rnn(torch.ones(1, 1, 8), hidden)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*diagnosis: autograd graph kept alive: * carries from step to step *hidden = hidden.detach()*"]
    )


def test_a_hook_that_appends_to_a_local_list_is_diagnosed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import torch

        def test_it(vramleak):
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
            activations = []
            model[0].register_forward_hook(lambda module, args, out: activations.append(out))
            for step in vramleak.steps(8):
                with torch.no_grad():
                    model(torch.ones(2, 8))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "    held by test_it:* local 'activations'[[]*]",
            "    diagnosis: a module hook keeps what it is given (a forward hook of a Linear, a lambda in test_it(), appends to what holds these tensors)*",
        ]
    )


def test_a_clean_loop_is_never_traced_and_a_late_leak_still_says_where_it_was_made(pytester: pytest.Pytester) -> None:
    # Recording sites starts after the first measured step that rose to a new high: a loop that
    # does not grow pays nothing for it, and a leak that starts late is recorded when it starts.
    pytester.makepyfile(
        test_it="""
        import tracemalloc
        import torch

        KEPT = []

        def test_clean(vramleak):
            traced = []
            for step in vramleak.steps(10, warmup=2):
                x = torch.ones(64) * step
                traced.append(tracemalloc.is_tracing())
            assert traced == [False] * 10

        def test_late(vramleak):
            for step in vramleak.steps(12, warmup=2):
                if step >= 7:
                    KEPT.append(torch.ones(256) * step)  # here
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["float32[[]256[]] on cpu: *", "    allocated at test_it.py:16 in test_late()"])


def test_a_step_that_raises_shows_the_users_frames_only(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        def train_step(i):
            if i == 3:
                raise ValueError("bad batch")

        def test_it(vramleak):
            vramleak.check(train_step, steps=6)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*vramleak.check(train_step, steps=6)", '*raise ValueError("bad batch")', "E *ValueError: bad batch"]
    )
    result.stdout.no_fnmatch_line("*pytest_vramleak*")


def test_a_loop_after_another_checked_test_sees_what_its_test_made_before_it(pytester: pytest.Pytester) -> None:
    # The batches are made before the loop and moved to Python's oldest generation; each step
    # frees one and keeps a tensor of its size: memory stays flat, after a checked test as alone.
    pytester.makepyfile(
        test_it="""
        import gc, torch

        def test_first(vramleak):
            for step in vramleak.steps(4):
                pass

        def test_frees_as_it_keeps(vramleak):
            batches = [torch.randn(1000) for _ in range(12)]
            gc.collect(1)
            kept = []
            for step in vramleak.steps(10):
                batches.pop()
                kept.append(torch.randn(1000))

        def test_keeps(vramleak):
            batches = [torch.randn(1000) for _ in range(12)]
            gc.collect(1)
            kept = []
            for step in vramleak.steps(10):
                kept.append(torch.randn(1000))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_it.py::test_keeps - VramLeak: memory grew 3.9 KiB per step*"])
