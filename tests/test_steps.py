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
        ["memory grew 4.0 KiB per step over 6 measured steps (24.0 KiB in total) on cpu, tolerance 0 B", "*test_it:* local 'history'[[]*]"],
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
    assert report["test_grows"]["outcome"] == "leaked"
    assert report["test_grows"]["steps"] == [1024, 2048, 3072, 4096, 5120]
    assert report["test_grows"]["growth_bytes"] == 5120
    assert report["test_flat"]["outcome"] == "passed"
    assert report["test_flat"]["steps"] == [0, 0]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("vramleak.steps(3, warmup=2)", "vramleak.steps(3, warmup=2) leaves 1 measured step(s); at least 2 are needed"),
        ("vramleak.steps(4, warmup=-1)", "vramleak.steps(n, warmup=k) takes whole numbers, got n=4, warmup=-1"),
        ("vramleak.steps(4.5)", "vramleak.steps(n, warmup=k) takes whole numbers, got n=4.5, warmup=2"),
        ("vramleak.check(print, steps=1)", "vramleak.steps(1, warmup=2) leaves 0 measured step(s); at least 2 are needed"),
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
    result.stdout.fnmatch_lines([message.replace("[", "[[]").replace("(", "[(]"), f"FAILED test_it.py::test_it - Failed: {message[:20]}*"])
    result.stdout.no_fnmatch_line("*pytest_vramleak*")


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
