"""Java in an image on a root of its own: the shipped ``java`` recipe (Debian's headless JDK),
built once per run (tests/own_root_image.py), compiles and runs a class from a Python cell on
both tiers, keeps a JVM inside the sandbox's memory limit, and its SBOM names the JDK that runs.
"""

from __future__ import annotations

import pytest

import support

from own_root_image import (  # noqa: F401 (the run's shared build, the tiers)
    check_not_in_default_image, check_runs_the_listed_version, check_sbom_names, run_labelled,
    java_image, tier,
)

# the first test of a run builds the shared image(s): minutes on 2 shared cores with cold caches
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

MAIN = """public class Main {
    public static void main(String[] args) {
        long sum = 0;
        for (int i = 1; i <= 100; i++) sum += (long) i * i;
        System.out.println(sum);
        if (args.length > 0) System.exit(Integer.parseInt(args[0]));
    }
}
"""

# A class launched from its source (`java Sum.java`, no javac), in a directory of its own:
# the source launcher refuses a class that is also on the class path.
SUM = """public class Sum {
    public static void main(String[] args) {
        System.out.println(java.util.stream.IntStream.rangeClosed(1, 10).sum());
    }
}
"""

# Allocates until the heap is full: the JVM's own OutOfMemoryError, not the sandbox's
# memory limit killing the process (or, on gVisor, the whole sandbox).
HOG = """public class Hog {
    public static void main(String[] args) {
        System.out.println(Runtime.getRuntime().maxMemory() / (1024 * 1024));
        java.util.List<long[]> kept = new java.util.ArrayList<>();
        while (true) kept.add(new long[1 << 20]);
    }
}
"""

JAVA_CELL = f"""import os, subprocess
os.makedirs("/workspace/single", exist_ok=True)
os.makedirs("/workspace/hog", exist_ok=True)
open("/workspace/Main.java", "w").write({MAIN!r})
open("/workspace/single/Sum.java", "w").write({SUM!r})
open("/workspace/hog/Hog.java", "w").write({HOG!r})
def run(*argv, cwd="/workspace"):
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    return done.returncode, done.stdout.strip(), done.stderr.strip()
print("javac", run("javac", "Main.java")[0])
print("answer", run("java", "Main")[:2])
print("exit", run("java", "Main", "3")[0])
print("single", run("java", "Sum.java", cwd="/workspace/single")[:2])
print("version", run("java", "-XshowSettings:properties", "-version")[2].split("java.version = ")[1].split()[0])
code, out, err = run("java", "Hog.java", cwd="/workspace/hog")
print("heap_mib", out)
print("hog", code, "java.lang.OutOfMemoryError" in err)
"""


def test_javac_and_java_run_from_a_python_cell_on_each_tier(api, new_sandbox, java_image, tier):
    sbx, events, out = run_labelled(api, new_sandbox, java_image, tier, JAVA_CELL)
    assert out["javac"] == "0", events
    assert out["answer"] == "(0, '338350')", events
    assert out["exit"] == "3", events
    assert out["single"] == "(0, '55')", events
    # the JVM's heap stays under the sandbox's memory limit, and filling it is the JVM's
    # OutOfMemoryError (exit 1) in a sandbox that lives on
    assert 0 < int(out["heap_mib"]) < sbx["limits"]["memory_mb"], (out["heap_mib"], sbx["limits"])
    assert out["hog"] == "1 True", events
    assert "alive 2" in support.stream_text(support.ok(support.execute(api, sbx["id"], "print('alive', 1 + 1)")))
    # the JDK that runs is the one the image's package list names (java.version 17.0.x is
    # openjdk-17-jre-headless 17.0.x+N-...)
    running = out["version"]
    check_runs_the_listed_version(java_image, f"openjdk-{running.split('.')[0]}-jre-headless", running, "+")


def test_the_sbom_lists_default_jdk_headless_with_its_debian_version(java_image):
    check_sbom_names(java_image, "default-jdk-headless")


def test_control_java_is_not_there_without_the_image(api, new_sandbox):
    """A sandbox of the default image (the host's /usr) has no java nor javac, so the JDK
    above is the image's."""
    check_not_in_default_image(api, new_sandbox, ("java", "javac"))
