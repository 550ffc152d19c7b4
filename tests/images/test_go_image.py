"""Go in an image on a root of its own: the shipped ``go`` recipe (Debian's golang-go), built
once per run (tests/own_root_image.py), builds and runs a program from a Python cell on both
tiers (the standard library only: no network, no module proxy), and its SBOM names the Go
that runs.
"""

from __future__ import annotations

import pytest

from own_root_image import (  # noqa: F401 (the run's shared build, the tiers)
    check_not_in_default_image, check_runs_the_listed_version, check_sbom_names, run_labelled,
    go_image, tier,
)

# the first test of a run builds the shared image(s): minutes on 2 shared cores with cold caches
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

MAIN = """package main

import (
	"fmt"
	"os"
	"sort"
	"strconv"
)

func main() {
	words := []string{"pear", "fig", "apple"}
	sort.Strings(words)
	sum := 0
	for i := 1; i <= 100; i++ {
		sum += i * i
	}
	fmt.Println(sum, words)
	if len(os.Args) > 1 {
		code, _ := strconv.Atoi(os.Args[1])
		os.Exit(code)
	}
}
"""

# HOME is /tmp in a sandbox (isolation/bwrap.py sandbox_environment), so Go's build cache
# ($HOME/.cache/go-build) and GOPATH ($HOME/go) are writable without any setting.
GO_CELL = f"""import subprocess
open("/workspace/main.go", "w").write({MAIN!r})
def run(*argv):
    done = subprocess.run(argv, capture_output=True, text=True, cwd="/workspace")
    return done.returncode, done.stdout.strip(), done.stderr.strip()
print("answer", run("go", "run", "main.go")[:2])
print("run_exit", run("go", "run", "main.go", "3")[::2])
print("build", run("go", "build", "-o", "/workspace/sum", "main.go")[0])
print("binary", run("/workspace/sum")[:2])
print("exit", run("/workspace/sum", "3")[0])
print("version", run("go", "env", "GOVERSION")[1])
"""


def test_go_run_from_a_python_cell_on_each_tier(api, new_sandbox, go_image, tier):
    _sbx, events, out = run_labelled(api, new_sandbox, go_image, tier, GO_CELL)
    assert out["answer"] == "(0, '338350 [apple fig pear]')", events
    # `go run` exits 1 and names the program's status; the built program exits with its own
    assert out["run_exit"] == "(1, 'exit status 3')", events
    assert out["build"] == "0", events
    assert out["binary"] == "(0, '338350 [apple fig pear]')", events
    assert out["exit"] == "3", events
    # the Go that runs is the one the image's package list names (go1.19.8 is golang-1.19-go 1.19.8-...)
    running = out["version"].removeprefix("go")
    check_runs_the_listed_version(go_image, f"golang-{'.'.join(running.split('.')[:2])}-go", running, "-")


def test_the_sbom_lists_golang_go_with_its_debian_version(go_image):
    check_sbom_names(go_image, "golang-go")


def test_control_go_is_not_there_without_the_image(api, new_sandbox):
    """A sandbox of the default image (the host's /usr) has no go, so the Go above is the image's."""
    check_not_in_default_image(api, new_sandbox, ("go",))
