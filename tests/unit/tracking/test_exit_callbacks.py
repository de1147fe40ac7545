"""The note of callbacks registered with atexit, which CPython keeps outside gc."""

from __future__ import annotations

import atexit
import gc

from pytest_vramleak.tracking import exit_callbacks
from pytest_vramleak.tracking.exit_callbacks import ExitCallbacks


class Writer:
    def flush(self) -> None:
        pass


def test_callbacks_registered_while_started_are_noted_weakly_and_the_wrapper_goes() -> None:
    original = atexit.register
    watch = ExitCallbacks()
    writer = Writer()
    argument = Writer()
    watch.start()
    try:
        assert atexit.register is not original

        def callback(value: object) -> None:
            pass

        assert atexit.register(callback, argument) is callback  # as a decorator would use it
        atexit.register(writer.flush)
    finally:
        watch.stop()
    assert atexit.register is original
    labels = {label: value for label, value in exit_callbacks.noted()}
    assert (
        labels[
            "atexit callback test_callbacks_registered_while_started_are_noted_weakly_and_the_wrapper_goes.<locals>.callback"
        ]
        is callback
    )
    assert (
        labels[
            "atexit callback test_callbacks_registered_while_started_are_noted_weakly_and_the_wrapper_goes.<locals>.callback: argument 1"
        ]
        is argument
    )
    assert labels["atexit callback Writer.flush -> __self__"] is writer
    # what atexit lets go is not kept by the note
    atexit.unregister(callback)
    atexit.unregister(writer.flush)
    del callback, writer, argument, labels
    gc.collect()
    assert not [label for label, _ in exit_callbacks.noted() if "noted_weakly" in label or "Writer" in label]


def test_a_wrapper_replaced_by_others_is_left_in_place() -> None:
    original = atexit.register
    watch = ExitCallbacks()
    watch.start()
    try:

        def theirs(func: object, *args: object, **kwargs: object) -> object:
            return func

        atexit.register = theirs  # type: ignore[assignment]
        watch.stop()
        assert atexit.register is theirs
    finally:
        atexit.register = original
