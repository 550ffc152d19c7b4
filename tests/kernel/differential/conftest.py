"""Both kernels for the differential tests: a plain ipykernel (the venv's `python3`
kernelspec) and the sandbox kernel on the session's server, started the same way, each
scenario on a fresh pair. What a scenario showed is kept for the module, so that the
comparison and the table's rows look at the same run."""

from __future__ import annotations

import pathlib
import typing as t

import pytest

import support

from .frontend import Frontend
from .scenarios import SCENARIOS

KERNELS = {"ipykernel": "python3", "sandbox": "sandbox"}


class Runner:
    def __init__(self, env: dict[str, str], root: pathlib.Path) -> None:
        self.env, self.root = env, root
        self.seen: dict[tuple[str, str, tuple[tuple[str, str], ...]], dict[str, t.Any]] = {}
        self.runs = 0

    def start(self, which: str, wait: bool = True, **env: str) -> Frontend:
        """A kernel as JupyterLab starts one; `wait=False` returns before it is ready."""

        self.runs += 1
        cwd = self.root / f"{which}-{self.runs}"
        cwd.mkdir()
        # ipykernel's history in a directory of its own: another run's cells never show up.
        full_env = dict(self.env, IPYTHONDIR=str(cwd / ".ipython"), **env)
        km = support.kernel_manager(KERNELS[which])
        km.start_kernel(cwd=str(cwd), env=full_env)
        kc = km.client()
        kc.start_channels()
        fe = Frontend(km, kc)
        if wait:
            kc.wait_for_ready(timeout=120)
        else:
            fe.subscribed(timeout=120)  # requests then go out before kernel_info, not before IOPub has us
        return fe

    def run(self, which: str, scenario: str, **env: str) -> dict[str, t.Any]:
        """The scenario on a fresh kernel: {request label: Observed}, in order (cached)."""
        key = (which, scenario, tuple(sorted(env.items())))
        if key not in self.seen:
            fe = self.start(which, wait=scenario != "burst_right_after_start", **env)
            try:
                SCENARIOS[scenario](fe)
                self.seen[key] = {fe.requests[m].label: fe.requests[m] for m in fe.order}
            finally:
                fe.kc.stop_channels()
                if fe.km.is_alive():
                    fe.km.shutdown_kernel(now=False)
        return self.seen[key]


@pytest.fixture(scope="module")
def runner(kernel_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Runner:
    return Runner(kernel_env, tmp_path_factory.mktemp("differential"))
