"""A fast mutation screen of one engine file against chosen test files (docs/engine.md,
"Mutation testing", the fourth run).

    .venv/bin/python scripts/mutation_screen.py gen scheduling/engine/actions/preempt.py
    nice -n 19 .venv/bin/python scripts/mutation_screen.py screen \\
        scheduling/engine/actions/preempt.py OUT.json [--only NAME,...] -- TESTFILE...

`gen` writes mutmut's mutants of the files named (and a copy of the rest of the
package) under mutants/, as `mutmut run` would, without its whole-suite stats run.
`screen` runs, in this one process, the test files once unmutated and then once per
mutant with MUTANT_UNDER_TEST naming it (mutmut's trampolines then call that mutant),
stopping at the first failure; it prints one line per mutant and writes
{name: exit code} to OUT.json (0: survived). A mutant the screen kills, mutmut kills
too; one that survives the chosen files may still die in the whole suite.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path


def generate(paths: list[str]) -> None:
    from mutmut.__main__ import create_file_mutants  # noqa: PLC0415 (optional tool)
    from mutmut.mutation.trampoline import set_mutant_under_test  # noqa: PLC0415
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir  # noqa: PLC0415

    set_mutant_under_test("mutant_generation")
    copy_src_dir()
    copy_also_copy_files()
    for path in paths:
        result = create_file_mutants(Path(path))
        if result.error:
            raise result.error


def screen(source: str, out: str, only: list[str] | None, tests: list[str]) -> None:
    sys.path.insert(0, str(Path.cwd() / "mutants"))
    os.environ["MUTANT_UNDER_TEST"] = ""
    module = importlib.import_module(source.removesuffix(".py").replace("/", "."))
    if "/mutants/" not in (module.__file__ or ""):
        raise SystemExit(f"{module.__name__} was not imported from mutants/: run gen first")
    import pytest  # noqa: PLC0415 (after the mutated package is first on the path)

    with open(f"mutants/{source}.meta") as f:
        names = list(json.load(f)["exit_code_by_key"])
    if only:
        names = [n for n in names if n.rsplit(".", 1)[1] in only or n in only]
    args = [
        *("-q", "-x", "-p", "no:cacheprovider", "-p", "no:django", "--confcutdir=tests/engine"),
        *("--timeout=120", "-o", "addopts=", "--tb=no", *tests),
    ]
    if pytest.main(args) != 0:
        raise SystemExit("the chosen tests fail without a mutant")
    results: dict[str, int] = {}
    for name in names:
        os.environ["MUTANT_UNDER_TEST"] = name
        start = time.monotonic()
        results[name] = int(pytest.main(args))
        verdict = "killed" if results[name] else "SURVIVED"
        print("MUTANT", name.rsplit(".", 1)[1], verdict, round(time.monotonic() - start, 1))
        Path(out).write_text(json.dumps(results, indent=0))
    os.environ["MUTANT_UNDER_TEST"] = ""
    killed = sum(1 for code in results.values() if code)
    print(f"TOTAL {len(results)} killed {killed} survived {len(results) - killed}")


def main(argv: list[str]) -> None:
    if argv[:1] == ["gen"]:
        generate(argv[1:])
    elif argv[:1] == ["screen"] and "--" in argv:
        head, tests = argv[1 : argv.index("--")], argv[argv.index("--") + 1 :]
        only = head[head.index("--only") + 1].split(",") if "--only" in head else None
        screen(head[0], head[1], only, tests)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
