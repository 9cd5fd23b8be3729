"""The command's progress lines while a lowered study compiles: which program, how long so far."""

import re
import time

import numpy as np

import diffsoup as ds
from diffsoup.examples import rober
from diffsoup.inference import Gaussian, Parameter
from diffsoup.inference.objective._lower import clear_program_cache
from diffsoup.workflows._compile_progress import CompileProgress, install_compile_progress


def test_progress_names_each_compiled_program_and_its_time():
    problem = rober().build()
    times = np.array([1.0, 1e2])
    sol = ds.simulate(problem, None, times, rtol=1e-10, atol=1e-14)
    study = ds.Study(problem, [ds.Experiment("r0", times, np.asarray(sol.ys), noise=Gaussian(0.01))],
                     [Parameter("k1", 0.04, 0.004, 0.4, scale="log10")])  # fmt: skip
    lines = []
    handler = install_compile_progress(lines.append, interval=0.05)
    assert install_compile_progress(lines.append) is handler  # once per process
    clear_program_cache()
    try:
        lowered = ds.lower(study)
        started = time.perf_counter()
        lowered.value_and_grad(lowered.nominal)
        total = time.perf_counter() - started
        # A second evaluation compiles nothing, so says nothing.
        n = len(lines)
        lowered.value_and_grad(lowered.nominal)
        assert len(lines) == n
    finally:
        from diffsoup.workflows._compile_progress import remove_compile_progress

        remove_compile_progress()
    starts = [line for line in lines if re.match(r"compiling the value_and_grad \((adjoint|forward sensitivities)\) program of 'ROBER'", line)]
    ends = [re.fullmatch(r"compiled the value_and_grad \((?:adjoint|forward sensitivities)\) program of 'ROBER', group 0, 1 experiment\(s\) per chunk "
                         r"in ([0-9.]+) s", line) for line in lines]  # fmt: skip
    ends = [float(m.group(1)) for m in ends if m]
    assert len(starts) == 1 and len(ends) == 1, lines
    assert 0 < ends[0] <= total + 0.1
    # A compilation of several seconds ticks at the interval in between, with seconds so far.
    ticks = [line for line in lines if line.startswith("  still compiling the value_and_grad (")]
    assert len(ticks) >= 2 and all(re.search(r"\(\d+ s so far\)$", t) for t in ticks), lines
    i_start, i_end = lines.index(starts[0]), next(i for i, line in enumerate(lines) if line.startswith("compiled "))
    assert all(i_start < lines.index(t) < i_end for t in ticks)


def test_records_without_compile_information_are_ignored():
    import logging

    lines = []
    handler = CompileProgress(lines.append)
    handler.emit(logging.LogRecord("diffsoup.compile", logging.INFO, __file__, 1, "other", (), None))
    assert lines == []


def test_the_command_leaves_no_progress_handler_behind(tmp_path, capsys):
    """The command prints progress while it runs; a caller that runs it in-process (a notebook, a
    test) gets its logger back as it was, with no ticker left running."""
    import logging

    from diffsoup.cli import main
    from diffsoup.workflows._compile_progress import remove_compile_progress

    remove_compile_progress()
    logger = logging.getLogger("diffsoup.compile")
    before = (logger.level, logger.propagate)
    study = tmp_path / "missing.toml"
    study.write_text("this is not a study file\n")
    main(["check", str(study)])
    assert not any(isinstance(h, CompileProgress) for h in logger.handlers)
    assert (logger.level, logger.propagate) == before  # not left at INFO, not cut off from the root logger
