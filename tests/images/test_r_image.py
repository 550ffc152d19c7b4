"""R in an image on a root of its own: the shipped ``r`` recipe (Debian's r-base-core), built
once per run (tests/own_root_image.py), runs `Rscript` from a Python cell on both tiers, and
its SBOM names the R that runs.
"""

from __future__ import annotations

import pytest

from own_root_image import (  # noqa: F401 (the run's shared build, the tiers)
    check_not_in_default_image, check_runs_the_listed_version, check_sbom_names, run_labelled,
    r_image, tier,
)

# the first test of a run builds the shared image(s): minutes on 2 shared cores with cold caches
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

R_CELL = """import subprocess
def rscript(expr):
    done = subprocess.run(["Rscript", "-e", expr], capture_output=True, text=True)
    return done.returncode, done.stdout
print("answer", rscript("cat(6*7)"))
frame = ('d <- data.frame(x = c(1, 2, 3, 4), g = c("a", "a", "b", "b")); '
         'a <- aggregate(x ~ g, d, mean); cat(paste(a$g, a$x), sep = ";"); cat("|", median(d$x))')
print("frame", rscript(frame))
print("version", rscript('cat(R.version$major, R.version$minor, sep = ".")'))
print("exit", rscript("quit(status = 3)")[0])
"""


def test_rscript_runs_from_a_python_cell_on_each_tier(api, new_sandbox, r_image, tier):
    _sbx, events, out = run_labelled(api, new_sandbox, r_image, tier, R_CELL)
    assert out["answer"] == "(0, '42')", events
    assert out["frame"] == "(0, 'a 1.5;b 3.5| 2.5')", events
    assert out["exit"] == "3", events
    # the R that runs is the one the image's package list names (r-base-core 4.2.2.20221110-2: R 4.2.2)
    running = out["version"].strip("()").split(", ")[1].strip("'")
    check_runs_the_listed_version(r_image, "r-base-core", running, ".")


def test_the_sbom_lists_r_base_core_with_its_debian_version(r_image):
    check_sbom_names(r_image, "r-base-core")


def test_control_rscript_is_not_there_without_the_image(api, new_sandbox):
    """The probe tells: a sandbox of the default image (the host's /usr) has no Rscript, so
    the R above is the image's (and the host has none to lend it)."""
    check_not_in_default_image(api, new_sandbox, ("Rscript",))
