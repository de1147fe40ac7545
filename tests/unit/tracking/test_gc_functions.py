"""gc's functions as the package uses them: what a broken traverse function of Python's would hand out is left out."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from pytest_vramleak.tracking import gc_functions


def test_the_asyncio_module_is_never_traversed_for_its_referents_where_that_reads_freed_memory() -> None:
    # CPython gh-122695: from 3.12.0 to 3.12.5, gc.get_referents(_asyncio) once an event loop has
    # run hands out the future iterators on its free list, freed memory: on 3.12.1 a list that grows
    # until memory runs out. In a process of its own, its address space bounded.
    code = textwrap.dedent(
        """
        import asyncio, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))
        from pytest_vramleak.tracking import gc_functions as gc

        async def fails():
            raise ValueError(1)

        async def returns():
            return 1

        loop = asyncio.new_event_loop()
        tasks = [loop.create_task(fails()), loop.create_task(returns())]
        loop.run_until_complete(asyncio.wait(tasks))
        tasks[0].exception()
        loop.close()
        module = sys.modules["_asyncio"]
        found = gc.get_referents(module, tasks[1])
        skipped = gc.TRAVERSES_FREED_MEMORY
        print("referents", len(found), "skipped" if skipped else "read")
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("referents ")
    assert run.stdout.split()[-1] == ("skipped" if gc_functions.TRAVERSES_FREED_MEMORY else "read")
