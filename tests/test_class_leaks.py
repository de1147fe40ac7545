"""Leaks in test classes and unittest TestCases: each run of a test gets the set-up pytest gives a
test (a fresh instance, fresh function-scoped fixtures), what a class keeps is named after the
class, and a catalogue of class-based leaks fails while each one's fixed twin passes."""

from __future__ import annotations

import textwrap

import pytest

# Each entry: a test file's body (a leak and its fixed twin, as tests named test_leak and
# test_fixed), and what the leak's failure must say. Every leak stays under 1 MiB a run: it fails
# because it grows, run after run, not because it is large.
CATALOGUE: dict[str, tuple[str, list[str]]] = {
    "class attribute appended to through self": (
        """
        class TestLeak:
            seen = []

            def test_leak(self):
                self.seen.append(torch.randn(4096))

        class TestFixed:
            seen = []

            def teardown_method(self):
                self.seen.clear()

            def test_fixed(self):
                self.seen.append(torch.randn(4096))
        """,
        [
            "*held by TestLeak.seen[[]*]",
            "*TestLeak.seen is a class attribute, not an instance attribute*teardown_method*",
        ],
    ),
    "state an instance carries from one run to the next": (
        """
        BANK = []

        class TestLeak:
            def test_leak(self):
                assert not hasattr(self, "cache"), "pytest gives every test a fresh instance"
                self.cache = []
                BANK.append(torch.randn(4096))

        class TestFixed:
            def test_fixed(self):
                assert not hasattr(self, "cache"), "pytest gives every test a fresh instance"
                self.cache = [torch.randn(4096)]
        """,
        ["*held by test_it.BANK[[]*]"],
    ),
    "class-scoped fixture each test appends to": (
        """
        @pytest.fixture(scope="class")
        def history():
            return []

        class TestLeak:
            def test_leak(self, history):
                history.append(torch.randn(4096))

        @pytest.fixture
        def own_history():
            return []

        class TestFixed:
            def test_fixed(self, own_history):
                own_history.append(torch.randn(4096))
        """,
        ["*held by fixture 'history' (class scope)[[]*]"],
    ),
    "setup_class list a method fills": (
        """
        class TestLeak:
            @classmethod
            def setup_class(cls):
                cls.outputs = []

            def test_leak(self):
                self.outputs.append(torch.randn(4096))

        class TestFixed:
            def setup_method(self):
                self.outputs = []

            def test_fixed(self):
                self.outputs.append(torch.randn(4096))
        """,
        ["*held by TestLeak.outputs[[]*]", "*TestLeak.outputs is a class attribute, not an instance attribute*"],
    ),
    "unittest setUpClass list a test fills": (
        """
        import unittest

        class TestLeak(unittest.TestCase):
            @classmethod
            def setUpClass(cls):
                cls.outputs = []

            def test_leak(self):
                self.outputs.append(torch.randn(4096))

        class TestFixed(unittest.TestCase):
            @classmethod
            def setUpClass(cls):
                cls.outputs = []

            def tearDown(self):
                self.outputs.clear()

            def test_fixed(self):
                self.outputs.append(torch.randn(4096))
        """,
        [
            "*held by TestLeak.outputs[[]*]",
            "*TestLeak.outputs is a class attribute, not an instance attribute*tearDown*",
        ],
    ),
    "unittest setUp that fills a module's cache": (
        """
        import unittest

        CACHE = {}

        class TestLeak(unittest.TestCase):
            def setUp(self):
                self.batch = torch.randn(4096)
                CACHE[len(CACHE)] = self.batch

            def test_leak(self):
                assert self.batch.numel() == 4096

        class TestFixed(unittest.TestCase):
            def setUp(self):
                self.batch = torch.randn(4096)
                CACHE[len(CACHE)] = self.batch

            def tearDown(self):
                CACHE.clear()

            def test_fixed(self):
                assert self.batch.numel() == 4096
        """,
        ["*held by test_it.CACHE[[]*]"],
    ),
    "model a setup_method hooks onto a class-wide model": (
        """
        MODEL = torch.nn.Linear(64, 64)

        class TestLeak:
            def setup_method(self):
                self.outputs = []
                MODEL.register_forward_hook(lambda module, args, output: self.outputs.append(output.detach()))

            def test_leak(self):
                MODEL(torch.randn(16, 64))

        OTHER_MODEL = torch.nn.Linear(64, 64)  # (the leak's hooks stay on MODEL)

        class TestFixed:
            def setup_method(self):
                self.outputs = []
                self.handle = OTHER_MODEL.register_forward_hook(
                    lambda module, args, output: self.outputs.append(output.detach())
                )

            def teardown_method(self):
                self.handle.remove()

            def test_fixed(self):
                OTHER_MODEL(torch.randn(16, 64))
        """,
        ["*held by test_it.MODEL._forward_hooks[[]*]*"],
    ),
}


@pytest.mark.parametrize("case", list(CATALOGUE))
def test_class_based_leak_fails_and_its_fixed_twin_passes(pytester: pytest.Pytester, run_checked, case: str) -> None:
    body, lines = CATALOGUE[case]
    pytester.makepyfile(test_it="import pytest\nimport torch\n" + textwrap.dedent(body))
    result, report = run_checked("--vramleak", "-p", "no:randomly")
    assert report["test_leak"]["verdict"] == "leaked", report["test_leak"]
    assert report["test_leak"]["pattern"] == "grows"
    assert report["test_fixed"]["verdict"] == "passed", report["test_fixed"]
    result.stdout.fnmatch_lines(lines)
    result.stdout.fnmatch_lines(["LEAKED test_it.py::TestLeak::test_leak - *"])
    result.assert_outcomes(passed=1, failed=1)


def test_every_run_gets_a_fresh_instance_and_fresh_function_fixtures(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import unittest

        import pytest
        import torch

        SEEN = {"instances": set(), "setup_method": 0, "function": 0, "class": 0, "module": 0, "session": 0}
        KEPT = []

        @pytest.fixture(scope="session")
        def per_session():
            SEEN["session"] += 1

        @pytest.fixture(scope="module")
        def per_module():
            SEEN["module"] += 1

        @pytest.fixture(scope="class")
        def per_class():
            SEEN["class"] += 1

        @pytest.fixture
        def per_function():
            SEEN["function"] += 1
            return []

        class TestGroup:
            def setup_method(self):
                SEEN["setup_method"] += 1
                assert not hasattr(self, "ran")

            def test_leaks(self, per_session, per_module, per_class, per_function):
                assert per_function == []
                per_function.append(1)
                self.ran = True
                SEEN["instances"].add(id(self))
                KEPT.append(self)  # (every instance stays: ids are not reused)
                KEPT.append(torch.randn(1024))

        UNIT = {"instances": set(), "setUp": 0, "setUpClass": 0}

        class TestUnit(unittest.TestCase):
            @classmethod
            def setUpClass(cls):
                UNIT["setUpClass"] += 1

            def setUp(self):
                UNIT["setUp"] += 1
                assert not hasattr(self, "ran")

            def test_unit_leaks(self):
                self.ran = True
                UNIT["instances"].add(id(self))
                KEPT.append(self)
                KEPT.append(torch.randn(1024))

        def test_counts():
            assert SEEN == {
                "instances": SEEN["instances"], "setup_method": 5, "function": 5, "class": 1, "module": 1, "session": 1
            }
            assert len(SEEN["instances"]) == 5
            assert UNIT == {"instances": UNIT["instances"], "setUp": 5, "setUpClass": 1}
            assert len(UNIT["instances"]) == 5
        """
    )
    # a leaking test runs again to confirm it (4 runs) and once more to record where its tensors are made
    result, report = run_checked("--vramleak", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=2)
    assert report["test_leaks"]["pattern"] == "grows"
    assert report["test_unit_leaks"]["pattern"] == "grows"


def test_a_run_again_that_fails_is_shown_and_leaves_the_leak_undecided(pytester: pytest.Pytester, run_checked) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest
        import torch

        BANK = []

        @pytest.mark.parametrize("callbacks", [[]])
        def test_appends_to_its_parameter(callbacks):
            # (a trainer that appends its own callbacks to the list it was given)
            assert not callbacks, "the parametrize value kept the last run's entry"
            callbacks.append(object())
            BANK.append(torch.randn(4096))
        """
    )
    result, report = run_checked("--vramleak", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    entry = report["test_appends_to_its_parameter[callbacks0]"]
    assert entry["verdict"] == "unchecked"
    assert entry["reason"].startswith("undecided: the first run kept 16.0 KiB")
    result.stdout.fnmatch_lines(
        [
            "*1 checked test: 1 passed; none leaked or went over budget, 1 unchecked",
            "test_it.py::test_appends_to_its_parameter[[]callbacks0[]]: undecided: the first run kept 16.0 KiB*"
            "run 2 of 4 failed in call (AssertionError: the parametrize value kept the last run's entry*",
        ]
    )


def test_a_repeated_test_whose_run_again_fails_says_so_in_the_terminal(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        CALLS = []

        def test_fails_on_third_call():
            CALLS.append(1)
            assert len(CALLS) < 3, f"call {len(CALLS)}"
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak", "--vramleak-repeat=6")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "test_it.py::test_fails_on_third_call: the runs after the first were not used: run 3 of 6 failed in call "
            "(AssertionError: call 3*); judged on the first run"
        ]
    )


def test_a_class_attribute_is_named_with_its_class_and_the_fix_that_frees_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import torch

        class TestAttr:
            cache = []

            def test_class_attr(self):
                self.cache.append(torch.randn(4096))
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--vramleak")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "    held by TestAttr.cache[[]*]",
            "    diagnosis: TestAttr.cache is a class attribute, not an instance attribute: pytest "
            "makes a fresh instance for every test, but the test class and what its attributes hold live until the session ends, "
            "so what every test adds to it stays: clear it in teardown_method*",
        ]
    )
    result.stdout.no_fnmatch_line("*held by self*")
    result.stdout.no_fnmatch_line("*set it to None in teardown_method*")


def test_a_storage_held_through_several_views_is_named_through_each(pytester: pytest.Pytester, run_checked) -> None:
    # Each setup_method adds a hook that appends its own view of every output (output.detach())
    # to its instance: an output's storage is held through one view per hook. Which view gc
    # lists first decides nothing (without sites recorded: the last run's, which the instance
    # pytest keeps holds).
    body, _ = CATALOGUE["model a setup_method hooks onto a class-wide model"]
    pytester.makepyfile(test_it="import pytest\nimport torch\n" + textwrap.dedent(body))
    result, report = run_checked("--vramleak", "--vramleak-sites=off", "-p", "no:randomly")
    assert report["test_leak"]["pattern"] == "grows"
    result.stdout.fnmatch_lines(
        [
            "*float32[[]16, 64[]] on cpu: 1 tensor*",
            "*held by test_it.MODEL._forward_hooks[[]*[]] -> closure var 'self'.outputs[[]*[]]",
            "*diagnosis: a module hook keeps what it is given*",
        ]
    )
    result.stdout.no_fnmatch_line("*diagnosis: pytest keeps each test's class instance*")
